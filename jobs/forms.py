from __future__ import annotations

import secrets
import string

from django import forms
from django.utils import timezone

from . import validators as v
from .models import NOTIFIABLE_EVENTS, PresetImage, TrainingJob, Workspace


def default_job_name() -> str:
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(4))
    return f"job-{timezone.now():%Y%m%d}-{suffix}"


class JobCreateForm(forms.ModelForm):
    """The short create form. Validation is the model's (full_clean), shared with the API."""

    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none(), empty_label=None)
    notify_events = forms.MultipleChoiceField(
        choices=[(str(kind), kind.label) for kind in NOTIFIABLE_EVENTS],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Notify on",
    )

    class Meta:
        model = TrainingJob
        fields = [
            "workspace",
            "name",
            "description",
            "image",
            "command",
            "node_count",
            "fault_tolerance",
            "max_restarts",
            "unconditional_restart",
            "hang_restart",
            "pod_retry_num",
            "hang_window_s",
            "notify_webhook_url",
            "notify_emails",
            "notify_events",
        ]
        labels = {
            "node_count": "Instance count",
            "command": "Start command",
            "fault_tolerance": "Fault tolerance (automatic restart)",
            "unconditional_restart": "Unconditional restart",
            "hang_restart": "Hang restart",
            "pod_retry_num": "Instance rescheduling count",
            "hang_window_s": "Hang detection window (seconds)",
            "notify_webhook_url": "Webhook URL",
            "notify_emails": "E-mail addresses",
        }
        help_texts = {
            "name": v.JOB_NAME_RULE,
            "description": "Optional, up to 256 characters.",
            "image": "A preset image or a local image reference (no registry is reachable).",
            "command": "Runs inside the container with sh -c; ';' and '&&' chains allowed.",
            "node_count": "1 or more; more than 1 runs a distributed job.",
            "max_restarts": "1-128, used when fault tolerance is on.",
            "unconditional_restart": "Restart whatever the failure, at most 3 times in a row; consumes max restarts.",
            "hang_restart": "Restart a stuck job in place, at most 3 times in a row; does not consume max restarts.",
            "pod_retry_num": "0-128: how often one instance of a multi-instance job may move off a lost host.",
            "hang_window_s": "Suspected hang after this long without CPU, log or GPU use; empty: platform default.",
            "notify_webhook_url": "Receives a JSON POST per subscribed event (retried on failure).",
            "notify_emails": "Comma-separated.",
        }
        widgets = {
            "command": forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
            "image": forms.TextInput(attrs={"list": "preset-images", "spellcheck": "false"}),
        }

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        from .access import workspaces_of

        self.fields["workspace"].queryset = workspaces_of(user)
        self.fields["command"].required = False  # the model says why, with its own message
        self.fields["max_restarts"].required = False
        self.fields["pod_retry_num"].required = False
        self.fields["hang_window_s"].required = False
        if not self.is_bound:
            self.initial.setdefault("name", default_job_name())
            preset = PresetImage.objects.order_by("id").first()
            if preset:
                self.initial.setdefault("image", preset.image_ref)

    def clean_max_restarts(self):
        value = self.cleaned_data.get("max_restarts")
        return 3 if value is None and not self.data.get("fault_tolerance") else value

    def clean_pod_retry_num(self):
        return self.cleaned_data.get("pod_retry_num") or 0

    def clean_hang_window_s(self):
        return self.cleaned_data.get("hang_window_s") or 0

    @property
    def presets(self):
        return PresetImage.objects.order_by("name")
