from __future__ import annotations

import secrets
import string

from django import forms
from django.utils import timezone

from . import validators as v
from .models import PresetImage, TrainingJob, Workspace


def default_job_name() -> str:
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(4))
    return f"job-{timezone.now():%Y%m%d}-{suffix}"


class JobCreateForm(forms.ModelForm):
    """The short create form. Validation is the model's (full_clean), shared with the API."""

    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none(), empty_label=None)

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
        ]
        labels = {
            "node_count": "Instance count",
            "command": "Start command",
            "fault_tolerance": "Fault tolerance (automatic restart)",
        }
        help_texts = {
            "name": v.JOB_NAME_RULE,
            "description": "Optional, up to 256 characters.",
            "image": "A preset image or a local image reference (no registry is reachable).",
            "command": "Runs inside the container with sh -c; ';' and '&&' chains allowed.",
            "node_count": "1 or more; more than 1 runs a distributed job.",
            "max_restarts": "1-128, used when fault tolerance is on.",
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
        if not self.is_bound:
            self.initial.setdefault("name", default_job_name())
            preset = PresetImage.objects.order_by("id").first()
            if preset:
                self.initial.setdefault("image", preset.image_ref)

    def clean_max_restarts(self):
        value = self.cleaned_data.get("max_restarts")
        return 3 if value is None and not self.data.get("fault_tolerance") else value

    @property
    def presets(self):
        return PresetImage.objects.order_by("name")
