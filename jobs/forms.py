"""The create-job wizard's form (SPEC §3).

The form only reshapes what the browser posts; every rule is TrainingJob.clean() and the
model's field validators (full_clean), which the API runs too. So the form's own fields
validate nothing that the model checks: no required flags, no max_length, no choice
lists (an unknown choice is the model's "must be one of ..." message), and objects are
chosen by name exactly as the API names them.

List-valued settings (env vars, tags, mounts) come either as JSON in the field itself
(`environments=[{"name": ..., ...}]`, what a script or a JavaScript row editor posts) or
as numbered rows of inputs, `environments-0-name`, `environments-0-value`,
`environments-0-sensitive`, ... (what a plain HTML form posts). Rows whose inputs are
all empty are skipped, so a template can always render one blank row.
"""

from __future__ import annotations

import json
import secrets
import string

from django import forms
from django.core.exceptions import ValidationError
from django.db import models as db_models
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from . import validators as v
from .models import (
    NOTIFIABLE_EVENTS,
    Dataset,
    DockerHost,
    Flavor,
    KeyPair,
    Model,
    PresetImage,
    PresetTemplate,
    ResourcePool,
    TrainingJob,
    Workspace,
)
from .wizard import STEP_OF_FIELD


def default_job_name() -> str:
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(4))
    return f"job-{timezone.now():%Y%m%d}-{suffix}"


class LooseChoiceField(forms.TypedChoiceField):
    """Renders the choices but leaves checking them to the model (one message for form and API)."""

    def valid_value(self, value) -> bool:
        return True


class LooseMultipleChoiceField(forms.TypedMultipleChoiceField):
    def valid_value(self, value) -> bool:
        return True


TRUE_STRINGS = {"on", "true", "1", "yes"}


COLUMN_LABELS = {
    "name": "Name",
    "value": "Value",
    "sensitive": "Sensitive",
    "key": "Key",
    "file_system": "File system",
    "path": "Path in it",
    "mount_path": "Mount path",
    "read_only": "Read-only",
    "options": "NFS options",
    "obs_url": "obs:// URL",
}


class RowsWidget(forms.Widget):
    """Numbered rows of inputs (`<name>-<i>-<column>`), or JSON posted in `<name>` itself."""

    def __init__(self, columns: dict[str, type], attrs=None):
        super().__init__(attrs)
        self.columns = columns

    def _row_keys(self, data, name: str) -> dict[int, dict]:
        rows: dict[int, dict] = {}
        prefix = f"{name}-"
        for key in data:
            if not key.startswith(prefix):
                continue
            index, _, column = key[len(prefix) :].partition("-")
            if index.isdigit() and column in self.columns:
                rows.setdefault(int(index), {})[column] = data.get(key)
        return rows

    def value_from_datadict(self, data, files, name):
        raw = data.get(name)
        if raw not in (None, ""):
            return raw
        rows = self._row_keys(data, name)
        return [rows[i] for i in sorted(rows)] if rows else None

    def value_omitted_from_data(self, data, files, name) -> bool:
        return name not in data and not self._row_keys(data, name)

    def render(self, name, value, attrs=None, renderer=None):
        rows = value if isinstance(value, list) else []
        # Rows the user left empty are dropped (that is how a row is removed), and one blank
        # row is added to type into.
        rows = [r for r in rows if isinstance(r, dict) and any(val not in ("", None, False) for val in r.values())]
        rows.append({})

        def cell(index: int, column: str, kind: type, row: dict):
            field = f"{name}-{index}-{column}"
            if kind is bool:
                checked = " checked" if row.get(column) in (True, "on", "true") else ""
                return format_html(
                    '<td><input type="checkbox" name="{}" aria-label="{}"{}></td>', field, column, checked
                )
            text = "" if row.get(column) is None else str(row.get(column))
            return format_html('<td><input type="text" name="{}" value="{}" aria-label="{}"></td>', field, text, column)

        head = format_html_join("", "<th>{}</th>", ((COLUMN_LABELS.get(c, c.replace("_", " ")),) for c in self.columns))
        body = format_html_join(
            "",
            "<tr>{}</tr>",
            (
                (format_html_join("", "{}", ((cell(i, c, k, row),) for c, k in self.columns.items())),)
                for i, row in enumerate(rows)
            ),
        )
        return format_html('<table class="rows" id="rows-{}"><tr>{}</tr>{}</table>', name, head, body)


class RowsField(forms.Field):
    """A list of objects with the given columns (str, bool or int values)."""

    def __init__(self, columns: dict[str, type], **kwargs):
        self.columns = columns
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", RowsWidget(columns))
        super().__init__(**kwargs)

    def to_python(self, value):
        if value in (None, "", []):
            return []
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                raise ValidationError(f"{self.label}: expected a JSON list of objects.") from None
            return parsed  # the model checks the shape, as for the API
        rows = []
        for raw in value:
            row = {}
            for column, kind in self.columns.items():
                item = raw.get(column)
                if kind is bool:
                    row[column] = str(item).strip().lower() in TRUE_STRINGS if item is not None else False
                elif kind is int:
                    text = "" if item is None else str(item).strip()
                    row[column] = int(text) if text.lstrip("-").isdigit() else text
                else:
                    row[column] = "" if item is None else str(item)
            if all(row[c] in ("", False) for c in self.columns):
                continue
            rows.append(row)
        return rows


ENV_COLUMNS = {"name": str, "value": str, "sensitive": bool}
TAG_COLUMNS = {"key": str, "value": str}
FS_MOUNT_COLUMNS = {"file_system": str, "path": str, "mount_path": str, "read_only": bool, "options": str}
OBS_MOUNT_COLUMNS = {"obs_url": str, "mount_path": str}

ENV_FILE_LABEL = "Import env vars from a file"
# The most an env-file import reads: ENV_MAX lines of the longest allowed value (ENV_VALUE_MAX
# characters, up to 4 bytes each in UTF-8) with a name of up to ENV_FILE_NAME_ALLOWANCE characters
# (names have no limit of their own) and the syntax around them (`export NAME='...'`, CRLF), and a
# UTF-8 byte order mark. A bigger file could not be imported anyway: it is refused, not read.
ENV_FILE_NAME_ALLOWANCE = 256
ENV_FILE_LINE_MAX_BYTES = len("export ") + ENV_FILE_NAME_ALLOWANCE + len("=''\r\n") + 4 * v.ENV_VALUE_MAX
ENV_FILE_MAX_BYTES = v.ENV_MAX * ENV_FILE_LINE_MAX_BYTES + len("\ufeff".encode())


def read_env_file(upload) -> str:
    """The text of an uploaded env file, reading at most ENV_FILE_MAX_BYTES + 1 bytes of it.

    ValidationError (the field's label and the limit in the message) when it is bigger or not
    UTF-8 text; the caller then imports nothing."""
    too_big = ValidationError(
        f"{ENV_FILE_LABEL}: refused, the file is larger than {ENV_FILE_MAX_BYTES:,} bytes, the most "
        f"{v.ENV_MAX} env vars with values of up to {v.ENV_VALUE_MAX:,} characters can take. Nothing was imported.",
        code="env_file_size",
    )
    if upload.size is not None and upload.size > ENV_FILE_MAX_BYTES:
        raise too_big
    upload.seek(0)
    data = upload.read(ENV_FILE_MAX_BYTES + 1)
    if len(data) > ENV_FILE_MAX_BYTES:
        raise too_big
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValidationError(
            "Env var import refused: the file is not UTF-8 text. Nothing was imported.", code="env_file_encoding"
        ) from None


# Objects the form names exactly as the API does: (field, what, whose).
NAMED_OBJECTS = [
    ("flavor", "Flavor", None),
    ("pool", "Resource pool", None),
    ("preset_image", "Preset image", None),
    ("preset_template", "Preset template", None),
    ("observe_file_system", "File system", None),
    ("ssh_key_pair", "key pair", "owner"),
    ("publish_model", "model", "owner"),
    ("base_model", "model", "owner"),
]

# Fields whose empty value means "the default" (as an absent key does in the API).
NO_DEFAULT_WHEN_EMPTY = {"max_restarts", "name"}


def _formfield(db_field, **kwargs):
    if db_field.choices and not isinstance(db_field, db_models.ForeignKey):
        kwargs["choices_form_class"] = LooseChoiceField
    return db_field.formfield(**kwargs)


def limits_without_flavor() -> str:
    """What an instance of a job without a flavor gets (SPEC §8: never unbounded): the
    public pools' operator limits."""
    pool = ResourcePool.objects.filter(kind=ResourcePool.Kind.PUBLIC).order_by("id").first()
    pool = pool or ResourcePool(name="default")
    return (
        f"Without a flavor each instance gets {pool.default_cpus:g} CPUs and {pool.default_memory_mb} MB of "
        f"memory; every container runs at most {pool.pids_limit} processes and threads (the operator's limits)."
    )


class JobCreateForm(forms.ModelForm):
    """The create-job wizard. Validation is the model's (full_clean), shared with the API."""

    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none(), empty_label=None)
    environments = RowsField(
        ENV_COLUMNS, label="Env vars", help_text=f"At most {v.ENV_MAX}; names like MY_VAR; clear a row to remove it."
    )
    env_file = forms.FileField(
        required=False,
        label=ENV_FILE_LABEL,
        help_text=f"KEY=VALUE lines; the whole file is refused if the total would exceed {v.ENV_MAX}.",
    )
    affinity_hosts = LooseMultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Affinity hosts"
    )
    file_system_mounts = RowsField(
        FS_MOUNT_COLUMNS,
        label="File system mounts",
        help_text=f"At most {v.MOUNTS_MAX}; a file system may be mounted twice, a mount path only once. "
        f"Mount options default to {v.DEFAULT_NFS_OPTIONS}.",
    )
    obs_mounts = RowsField(OBS_MOUNT_COLUMNS, label="Object storage mount", help_text="At most one bucket path.")
    datasets = LooseMultipleChoiceField(
        required=False,
        coerce=int,
        widget=forms.CheckboxSelectMultiple,
        label="Datasets",
        help_text=f"At most {v.DATASETS_MAX}: preset data or your own online data.",
        error_messages={"invalid_choice": "Datasets are chosen by id (a whole number); got %(value)s."},
    )
    keep_logs = forms.BooleanField(required=False, label="Keep logs permanently")
    tags = RowsField(TAG_COLUMNS, label="Tags", help_text=f"At most {v.TAGS_MAX} key/value pairs with unique keys.")
    notify_events = LooseMultipleChoiceField(
        choices=[(str(kind), kind.label) for kind in NOTIFIABLE_EVENTS],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Notify on",
    )

    class Meta:
        model = TrainingJob
        formfield_callback = _formfield
        # In the wizard's order; every step's fields (jobs/wizard.py), the one list of them.
        fields = [name for name in STEP_OF_FIELD if name != "env_file"]
        labels = {
            "base_model": "Base model",
            "preset_template": "Preset template",
            "image_source": "Image source",
            "preset_image": "Preset image",
            "image_kind": "Custom image type",
            "command": "Start command",
            "code_dir": "Code dir",
            "code_backup_dir": "Code backup dir",
            "local_code_dir": "Local code dir",
            "pool_type": "Resource pool type",
            "pool": "Resource pool",
            "spec_type": "Spec type",
            "custom_cpus": "CPUs",
            "custom_memory_gb": "Memory (GB)",
            "custom_gpus": "GPUs",
            "node_count": "Instance count",
            "affinity": "Affinity",
            "affinity_strength": "Affinity strength",
            "preemptible": "Allow preemption",
            "store_artifacts": "Store training artifacts",
            "artifact_path": "Artifact storage path",
            "artifact_mount_path": "Artifact mount path",
            "auto_publish": "Auto-publish the final model",
            "publish_as": "Publish as",
            "model_name": "Model name",
            "model_type": "Model type",
            "model_brand": "Model brand",
            "model_description": "Model description",
            "publish_model": "Existing model",
            "version_description": "Version description",
            "fault_tolerance": "Fault tolerance (automatic restart)",
            "unconditional_restart": "Unconditional restart",
            "hang_restart": "Hang restart",
            "pod_retry_num": "Instance rescheduling count",
            "operator_reexecution": "Operator re-execution",
            "hang_window_s": "Hang detection window (seconds)",
            "jupyter_lab": "JupyterLab",
            "ssh_remote": "SSH remote development",
            "ssh_key_pair": "Key pair",
            "mutual_trust": "Generate mutual-trust SSH files",
            "mutual_trust_dir": "Mutual-trust SSH files dir",
            "tensorboard": "TensorBoard",
            "mindstudio_insight": "MindStudio Insight",
            "observe_file_system": "Summary file system",
            "observe_path": "Summary path",
            "metrics_mode": "Prometheus metrics",
            "metrics_path": "Metrics URL path",
            "metrics_port": "Metrics port",
            "metrics_command": "Metrics command",
            "metrics_args": "Metrics command arguments",
            "log_export_path": "Log path",
            "log_time_range_download": "Log download by time range",
            "visibility": "Visible to",
            "auto_stop_hours": "Auto stop after (hours)",
            "retention_hours": "Retention (hours)",
            "notify_webhook_url": "Webhook URL",
            "notify_emails": "E-mail addresses",
        }
        help_texts = {
            "workspace": "The workspace the job belongs to (the API's project_id); its members see it.",
            "training_mode": "Custom: your own code. Fine-tuning: starts from a preset template or a model asset.",
            "base_model": "Fine-tuning: one of your model assets to start from.",
            "preset_template": "Optional: fills description, image, command, code dir, local code dir and env vars.",
            "image_source": "A preset image registered by the operator, or your own image reference.",
            "preset_image": "Registered by the operator; needs a code dir.",
            "pool_type": "Public: shared hosts. Dedicated: a pool of hosts, with the options below.",
            "pool": "Free nodes, CPUs, memory and GPUs per pool; fragmentation: free capacity on partly used nodes.",
            "flavor": "Must exist; a single-process flavor refuses more than one instance; on the public pool the "
            "image type and flavor type must match (all CPU or all GPU).",
            "custom_cpus": "No more than the pool's node size.",
            "custom_memory_gb": "No more than the pool's node size.",
            "custom_gpus": "No more than the pool's node size.",
            "affinity": "Dedicated pools: run on (affinity) or away from (anti-affinity) the hosts below.",
            "affinity_strength": "Strong: only there (the job waits). Weak: preferred, elsewhere if needed.",
            "affinity_hosts": "Hosts of the pool.",
            "store_artifacts": "Keep the job's outputs in object storage; the mount survives restarts (checkpoints).",
            "auto_publish": "When the job completes, its artifacts become a model asset version.",
            "publish_as": "A new model (version V1), or the next version of one of your models.",
            "model_type": "Text generation, image understanding, image generation, video generation or other.",
            "model_brand": "Optional, e.g. Qwen.",
            "model_description": f"Required for a new model; up to {v.VERSION_DESCRIPTION_MAX} characters.",
            "publish_model": "One of your models; the version is the previous one + 1.",
            "fault_tolerance": "Off by default. On: failed jobs restart automatically, up to max restarts.",
            "jupyter_lab": "Open JupyterLab in the running job.",
            "ssh_key_pair": "One of your key pairs.",
            "mutual_trust_dir": f"Default {v.DEFAULT_MUTUAL_TRUST_DIR}.",
            "observe_file_system": "Dedicated pools: the file system the summaries are written to.",
            "observe_path": "Default /home/ma-user/summary.",
            "metrics_mode": "Off, by HTTP (URL path + port inside the container) or by command.",
            "metrics_path": "e.g. /metrics",
            "metrics_port": "1-65535, inside the container.",
            "metrics_args": "Arguments of the metrics command.",
            "keep_logs": "On by default for NPU flavors. Off: logs are deleted 30 days after the job ends.",
            "log_time_range_download": "Allow downloading a time range of the log.",
            "visibility": "Workspace members (default), or only you (and those who may list all jobs).",
            "notify_events": "Sent to the webhook and the e-mail addresses.",
            "name": v.JOB_NAME_RULE,
            "description": f"Optional: {v.DESCRIPTION_RULE}.",
            "image": "A custom image reference (no registry is reachable: the image must be on the hosts).",
            "image_kind": "What the custom image is built for; on the public pool it must match the flavor.",
            "command": "Runs inside the container with sh -c; ';' and '&&' chains allowed.",
            "code_dir": "obs://bucket/path/ (ending in '/'); required with a preset image; at most 5 GB, "
            "1000 files, 32 levels deep. Appears at ${MA_JOB_DIR}/<last folder>.",
            "code_backup_dir": "Optional obs:// folder: the local code folder is copied to "
            "<dir>/<job>-<task>-<index>/user-job-dir/<folder> at start.",
            "local_code_dir": f"Default {v.DEFAULT_LOCAL_CODE_DIR}; not /home/ma-user nor under "
            "/home/ma-user/modelarts/, /home/ma-user/modelarts-dev/, /home/ma-user/infer/.",
            "spec_type": "Dedicated pools: a preset flavor or a custom spec no larger than the pool's node size.",
            "node_count": "1 or more; more than 1 runs a distributed job.",
            "priority": "Dedicated pools: 1-3 (3 needs the permission 'may use high priority').",
            "preemptible": "Dedicated pools: the job may be stopped and re-queued to make room.",
            "artifact_path": "obs://bucket/path/ where the job's outputs are kept.",
            "artifact_mount_path": "Letters, digits, '-', '_', '/'; "
            "not /home/, /home/ma-user/, /home/ma-user/modelarts/.",
            "model_name": v.MODEL_NAME_RULE,
            "version_description": f"Optional, up to {v.VERSION_DESCRIPTION_MAX} characters. "
            "The version (V1, or the previous one + 1) is set by the platform.",
            "max_restarts": "1-128, used when fault tolerance is on.",
            "unconditional_restart": "Restart whatever the failure, at most 3 times in a row; consumes max restarts.",
            "hang_restart": "Restart a stuck job in place, at most 3 times in a row; does not consume max restarts.",
            "pod_retry_num": "0-128: how often one instance of a multi-instance job may move off a lost host.",
            "operator_reexecution": "Retry a failed communication operator (an Ascend feature): passed to the "
            "container as configuration (MA_OPERATOR_REEXECUTION=1); the console does nothing else with it.",
            "hang_window_s": "Suspected hang after this long without CPU, log or GPU use; empty: platform default.",
            "ssh_remote": "Needs a key pair of yours; excludes mutual-trust SSH files.",
            "mutual_trust": f"Directory default {v.DEFAULT_MUTUAL_TRUST_DIR}; excludes SSH remote development.",
            "tensorboard": "Dedicated pools; needs a file system; excludes MindStudio Insight.",
            "mindstudio_insight": "Dedicated pools; needs a file system; excludes TensorBoard.",
            "metrics_command": "Prints Prometheus text within seconds, e.g. 'cat'.",
            "log_export_path": "obs://bucket/path/; required when logs are kept permanently.",
            "auto_stop_hours": "Empty: off. 1, 2, 4, 6 or a custom 1-720 hours; time queued does not count.",
            "retention_hours": "Dedicated pools: keep the containers 1-720 hours after the end; "
            "not with fault tolerance.",
            "notify_webhook_url": "Receives a JSON POST per subscribed event (retried on failure).",
            "notify_emails": "Comma-separated.",
        }
        widgets = {
            "auto_stop_hours": forms.NumberInput(attrs={"list": "hour-presets", "placeholder": "off"}),
            "retention_hours": forms.NumberInput(attrs={"list": "hour-presets", "placeholder": "off"}),
            "command": forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
            "image": forms.TextInput(attrs={"list": "preset-images", "spellcheck": "false"}),
            "description": forms.TextInput(),
            "model_description": forms.Textarea(attrs={"rows": 2}),
            "version_description": forms.Textarea(attrs={"rows": 2}),
        }

    def __init__(self, *args, user=None, template: PresetTemplate | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        from .access import workspaces_of

        self.user = user
        self.fields["workspace"].queryset = workspaces_of(user)
        self.fields["flavor"].help_text = f"{self.fields['flavor'].help_text} {limits_without_flavor()}"
        for name, field in self.fields.items():
            if name == "workspace":
                continue
            # The model validates; the form only converts (see the module docstring).
            field.required = False
            field.validators = []
            if hasattr(field, "max_length"):
                field.max_length = None
            if isinstance(field, LooseChoiceField):
                # ModelForm shows a model error with the form field's message of the same code:
                # give the field the model's, so the form says what the API says.
                model_field = TrainingJob._meta.get_field(name)
                field.error_messages["invalid_choice"] = model_field.error_messages["invalid_choice"]
        for name, what, whose in NAMED_OBJECTS:
            field = self.fields[name]
            field.to_field_name = "name"
            if whose:
                field.queryset = field.queryset.filter(owner=user) if user is not None else field.queryset.none()
                field.error_messages["invalid_choice"] = f"You have no {what} named '%(value)s'."
            else:
                field.error_messages["invalid_choice"] = f"{what} '%(value)s' does not exist."
        self._pool_picker()
        self.fields["datasets"].choices = [
            (d.id, f"{d.name} ({'preset' if d.is_preset else 'mine'})") for d in self.dataset_choices
        ]
        self.fields["affinity_hosts"].choices = [
            (h.name, f"{h.name} ({h.pool or 'no pool'})") for h in DockerHost.objects.select_related("pool")
        ]
        if not self.is_bound:
            self.initial.setdefault("name", default_job_name())
            if template is not None:
                self.initial.update(self.template_initial(template))
            else:
                preset = PresetImage.objects.order_by("id").first()
                if preset:
                    self.initial.setdefault("image", preset.image_ref)

    def _pool_picker(self) -> None:
        """SPEC §3 "pool": the picker shows each dedicated pool's free nodes, GPUs, CPUs, memory
        and fragmentation. Only the shown choices change: any pool name is still checked by the
        model, so the form's message for a wrong one is the API's."""
        from .capacity import pool_usage

        pools = ResourcePool.objects.filter(kind=ResourcePool.Kind.DEDICATED).order_by("name")
        widget = forms.RadioSelect(attrs={"class": "pool-picker"})
        widget.choices = [(p.name, f"{p.name} · {p.node_size} per node · {pool_usage(p).text()}") for p in pools]
        self.fields["pool"].widget = widget

    # -- what the template shows ------------------------------------------------------------------
    @property
    def presets(self):
        return PresetImage.objects.order_by("name")

    @property
    def templates(self):
        return PresetTemplate.objects.select_related("image")

    @property
    def dataset_choices(self):
        """Preset data and the user's own online data."""
        mine = db_models.Q(owner__isnull=True)
        if self.user is not None and self.user.is_authenticated:
            mine |= db_models.Q(owner=self.user)
        return Dataset.objects.filter(mine, online=True)

    @property
    def npu_flavors(self) -> list[str]:
        """Flavors for which the page turns "keep logs permanently" on by default."""
        return list(Flavor.objects.filter(npu=True).values_list("name", flat=True))

    @property
    def key_pairs(self):
        return KeyPair.objects.filter(owner=self.user) if self.user is not None else KeyPair.objects.none()

    @property
    def my_models(self):
        return Model.objects.filter(owner=self.user) if self.user is not None else Model.objects.none()

    @staticmethod
    def template_initial(template: PresetTemplate) -> dict:
        """Initial values after choosing a preset template (the page's "Select preset template")."""
        job = template.apply_template(TrainingJob())
        return {
            "preset_template": template.name,
            "description": job.description,
            "image_source": job.image_source,
            "preset_image": job.preset_image.name if job.preset_image_id else None,
            "image": job.image,
            "image_kind": job.image_kind,
            "command": job.command,
            "code_dir": job.code_dir,
            "local_code_dir": job.local_code_dir,
            "environments": job.environments,
        }

    # -- conversion -------------------------------------------------------------------------------------
    def _update_errors(self, errors):
        """Model errors of a field the form could not even convert are left out: the API, which
        stops at such a value, reports it alone too."""
        if hasattr(errors, "error_dict") and self._errors:
            kept = {f: m for f, m in errors.error_dict.items() if f not in self._errors}
            if not kept:
                return
            errors = ValidationError(kept)
        super()._update_errors(errors)

    def clean_max_restarts(self):
        value = self.cleaned_data.get("max_restarts")
        return 3 if value is None and not self.data.get("fault_tolerance") else value

    def clean(self):
        cleaned = super().clean()
        for field in self._meta.model._meta.fields:
            if field.name not in cleaned or field.name in NO_DEFAULT_WHEN_EMPTY or not field.has_default():
                continue
            if isinstance(field, db_models.BooleanField):
                continue
            if cleaned[field.name] in (None, "") or cleaned[field.name] == []:
                cleaned[field.name] = field.get_default()
        upload = cleaned.get("env_file")
        if upload:
            self._import_env_file(upload, cleaned)
        self._check_quota()
        return cleaned

    def _check_quota(self) -> None:
        """SPEC §3 "quota": the account rule the API view applies too (jobs.access.check_quota).
        The view should also call it in the transaction that saves, where it locks the account."""
        from .access import check_quota

        try:
            check_quota(self.user)
        except ValidationError as exc:
            self.add_error(None, exc)

    def _import_env_file(self, upload, cleaned) -> None:
        current = cleaned.get("environments")
        current = current if isinstance(current, list) else []
        try:
            text = read_env_file(upload)
        except ValidationError as exc:
            self.add_error("env_file", exc)
            return
        try:
            rows = v.parse_env_file(text, existing=len(current))
        except ValidationError as exc:
            self.add_error("env_file", exc)
            return
        cleaned["environments"] = current + rows


def copy_name(name: str) -> str:
    """The name a copied job is proposed: the source's with "-copy" (within the 64 characters)."""
    return f"{name[:59]}-copy"  # 64 characters at most (SPEC §3)


def copy_initial(job: TrainingJob) -> dict:
    """The wizard's initial values for "Copy job": the job's configuration, objects by name,
    sensitive env var values left empty (they are never shown again after submit)."""
    fields = [f for f in JobCreateForm._meta.fields if f in {m.name for m in TrainingJob._meta.fields}]
    initial = forms.model_to_dict(job, fields=fields)
    for name, _what, _whose in NAMED_OBJECTS:
        related = getattr(job, name)
        initial[name] = related.name if related is not None else None
    initial["workspace"] = job.workspace_id
    initial["name"] = copy_name(job.name)
    initial["keep_logs"] = bool(job.keep_logs)
    initial["environments"] = [
        {**env, "value": "" if env.get("sensitive") else env.get("value", "")} for env in job.environments or []
    ]
    return initial
