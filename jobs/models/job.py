"""The training job: what the user asked for (SPEC §3) and where it stands."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxLengthValidator
from django.db import models
from django.utils import timezone
from django.utils.text import capfirst

from jobs import validators as v

from .catalogue import (
    FileSystem,
    Flavor,
    KeyPair,
    Model,
    ModelVersion,
    PresetImage,
    PresetTemplate,
    ProcessorKind,
    ResourcePool,
    Workspace,
)
from .rules import MASK, JobRules, _Errors  # noqa: F401


class Phase(models.TextChoices):
    CREATING = "Creating"
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETED = "Completed"
    FAILED = "Failed"
    ABNORMAL = "Abnormal"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    # A job with retention keeps its containers for retention_hours after it ends (SPEC §3 "retention").
    COMPLETED_RETAINED = "CompletedRetained", "Completed (retained)"
    FAILED_RETAINED = "FailedRetained", "Failed (retained)"


FINAL_PHASES = {Phase.COMPLETED, Phase.FAILED, Phase.TERMINATED}
RETAINED_PHASES = {Phase.COMPLETED_RETAINED, Phase.FAILED_RETAINED}


class TrainingJob(JobRules, models.Model):
    """A training job and every setting of the create wizard (SPEC §3).

    `clean()` is the one validation path: the form (ModelForm) and the API (which builds a
    TrainingJob and calls full_clean()) both end here, so both refuse the same values with
    the same messages. Toggles keep the values of their sub-fields when off; only what a
    toggle turns on is validated and used.
    """

    class TrainingMode(models.TextChoices):
        CUSTOM = "custom", "Custom job"
        FINETUNE = "finetune", "Fine-tuning job"

    class ImageSource(models.TextChoices):
        PRESET = "preset", "Preset image"
        CUSTOM = "custom", "Custom image"

    class PoolType(models.TextChoices):
        PUBLIC = "public", "Public resource pool"
        DEDICATED = "dedicated", "Dedicated resource pool"

    class SpecType(models.TextChoices):
        PRESET = "preset", "Preset flavor"
        CUSTOM = "custom", "Custom spec"

    class Affinity(models.TextChoices):
        AFFINITY = "affinity", "Node affinity"
        ANTI_AFFINITY = "anti_affinity", "Node anti-affinity"

    class AffinityStrength(models.TextChoices):
        REQUIRED = "required", "Strong (required)"
        PREFERRED = "preferred", "Weak (preferred)"

    class PublishAs(models.TextChoices):
        NEW = "new", "New model"
        VERSION = "version", "New version of an existing model"

    class MetricsMode(models.TextChoices):
        HTTP = "http", "HTTP"
        COMMAND = "command", "Command"

    class Visibility(models.TextChoices):
        WORKSPACE = "workspace", "Workspace members"
        CREATOR = "creator", "Only the creator"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")

    # -- mode and basic information ---------------------------------------------------------------
    training_mode = models.CharField(
        max_length=16,
        choices=TrainingMode.choices,
        default=TrainingMode.CUSTOM,
        error_messages={"invalid_choice": "Training mode must be custom or finetune; got %(value)r."},
    )
    base_model = models.ForeignKey(
        Model, null=True, blank=True, on_delete=models.PROTECT, related_name="finetune_jobs",
        help_text="Fine-tuning: the model asset the job starts from.",
    )  # fmt: skip
    name = models.CharField(max_length=64, blank=True, validators=[v.job_name_validator])
    description = models.CharField(max_length=v.DESCRIPTION_MAX, blank=True, validators=[v.validate_description])

    # -- training ------------------------------------------------------------------------------------
    preset_template = models.ForeignKey(
        PresetTemplate, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    image_source = models.CharField(
        max_length=16,
        choices=ImageSource.choices,
        default=ImageSource.CUSTOM,
        error_messages={"invalid_choice": "Image source must be preset or custom; got %(value)r."},
    )
    preset_image = models.ForeignKey(PresetImage, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    image = models.CharField(max_length=255, blank=True, validators=[v.image_reference_validator])
    image_kind = models.CharField(
        max_length=8,
        choices=ProcessorKind.choices,
        blank=True,
        help_text="CPU/GPU/NPU: a preset image's kind, or what a custom image is built for (empty: unknown).",
        error_messages={"invalid_choice": "Image kind must be cpu, gpu or npu; got %(value)r."},
    )
    command = models.TextField(blank=True)
    code_dir = models.CharField(max_length=1024, blank=True, validators=[v.obs_dir_validator("Code dir")])
    code_backup_dir = models.CharField(max_length=1024, blank=True, validators=[v.obs_dir_validator("Code backup dir")])
    local_code_dir = models.CharField(
        max_length=1024, default=v.DEFAULT_LOCAL_CODE_DIR, validators=[v.validate_local_code_dir]
    )
    environments = models.JSONField(
        default=list, blank=True, help_text='[{"name": "KEY", "value": "...", "sensitive": false}], at most 100.'
    )

    # -- resources ----------------------------------------------------------------------------------------
    pool_type = models.CharField(
        max_length=16,
        choices=PoolType.choices,
        default=PoolType.PUBLIC,
        error_messages={"invalid_choice": "Pool type must be public or dedicated; got %(value)r."},
    )
    pool = models.ForeignKey(ResourcePool, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    spec_type = models.CharField(
        max_length=16,
        choices=SpecType.choices,
        default=SpecType.PRESET,
        error_messages={"invalid_choice": "Spec type must be preset or custom; got %(value)r."},
    )
    custom_cpus = models.FloatField(null=True, blank=True)
    custom_memory_gb = models.FloatField(null=True, blank=True)
    custom_gpus = models.IntegerField(null=True, blank=True)
    node_count = models.PositiveIntegerField(default=1)
    flavor = models.ForeignKey(Flavor, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    affinity = models.CharField(
        max_length=16,
        choices=Affinity.choices,
        blank=True,
        help_text="Empty: no affinity.",
        error_messages={"invalid_choice": "Affinity must be affinity or anti_affinity (empty: off); got %(value)r."},
    )
    affinity_strength = models.CharField(
        max_length=16,
        choices=AffinityStrength.choices,
        default=AffinityStrength.REQUIRED,
        error_messages={"invalid_choice": "Affinity strength must be required or preferred; got %(value)r."},
    )
    affinity_hosts = models.JSONField(default=list, blank=True, help_text="Names of Docker hosts of the pool.")
    file_system_mounts = models.JSONField(
        default=list,
        blank=True,
        help_text='[{"file_system": name, "path": "/", "mount_path": "/mnt/x", "read_only": false, "options": "..."}]',
    )
    obs_mounts = models.JSONField(
        default=list, blank=True, help_text='At most one: [{"obs_url": "obs://bucket/path/", "mount_path": "/mnt/y"}]'
    )
    priority = models.IntegerField(default=v.PRIORITY_DEFAULT)
    preemptible = models.BooleanField(default=False)

    # -- data -----------------------------------------------------------------------------------------------
    datasets = models.JSONField(default=list, blank=True, help_text="Ids of datasets (at most 3).")

    # -- storage (training artifacts and publishing) -----------------------------------------------------------
    store_artifacts = models.BooleanField(default=False)
    artifact_path = models.CharField(
        max_length=1024, blank=True, validators=[v.obs_dir_validator("Artifact storage path")]
    )
    artifact_mount_path = models.CharField(
        max_length=1024, default=v.DEFAULT_ARTIFACT_MOUNT_PATH, validators=[v.validate_artifact_mount_path]
    )
    auto_publish = models.BooleanField(default=False)
    publish_as = models.CharField(
        max_length=16,
        choices=PublishAs.choices,
        default=PublishAs.NEW,
        error_messages={"invalid_choice": "Publish as must be new or version; got %(value)r."},
    )
    model_name = models.CharField(max_length=v.MODEL_NAME_MAX, blank=True)
    model_type = models.CharField(
        max_length=32,
        choices=Model.Type.choices,
        blank=True,
        error_messages={"invalid_choice": "Model type must be one of " + ", ".join(Model.Type.values) + "."},
    )
    model_brand = models.CharField(max_length=64, blank=True)
    model_description = models.CharField(max_length=256, blank=True)
    publish_model = models.ForeignKey(
        Model, null=True, blank=True, on_delete=models.SET_NULL, related_name="publishing_jobs"
    )
    version_description = models.CharField(max_length=v.VERSION_DESCRIPTION_MAX, blank=True)

    # High availability (SPEC §4). R is max_restarts when fault tolerance is on, else 0.
    fault_tolerance = models.BooleanField(default=False)
    max_restarts = models.PositiveIntegerField(default=3)
    unconditional_restart = models.BooleanField(default=False)
    hang_restart = models.BooleanField(default=False)
    pod_retry_num = models.PositiveIntegerField(default=0, help_text="Instance rescheduling count P (0-128).")
    operator_reexecution = models.BooleanField(
        default=False, help_text="Retry a failed communication operator (Ascend); passed to the container."
    )

    # Hang detection window (SPEC §6); 0 uses the platform default.
    hang_window_s = models.PositiveIntegerField(default=0)

    # -- access ----------------------------------------------------------------------------------------------
    jupyter_lab = models.BooleanField(default=False)
    ssh_remote = models.BooleanField(default=False)
    ssh_key_pair = models.ForeignKey(KeyPair, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    mutual_trust = models.BooleanField(default=False)
    mutual_trust_dir = models.CharField(
        max_length=1024,
        default=v.DEFAULT_MUTUAL_TRUST_DIR,
        validators=[v.validate_directory("Mutual-trust SSH files dir")],
    )

    # -- observe -----------------------------------------------------------------------------------------------
    tensorboard = models.BooleanField(default=False)
    mindstudio_insight = models.BooleanField(default=False)
    observe_file_system = models.ForeignKey(
        FileSystem, null=True, blank=True, on_delete=models.PROTECT, related_name="observing_jobs"
    )
    observe_path = models.CharField(
        max_length=1024, default=v.DEFAULT_SUMMARY_PATH, validators=[v.mount_path_validator("Summary path")]
    )
    metrics_mode = models.CharField(
        max_length=16,
        choices=MetricsMode.choices,
        blank=True,
        help_text="Prometheus metrics: empty (off), by HTTP or by command.",
        error_messages={"invalid_choice": "Metrics mode must be http or command (empty: off); got %(value)r."},
    )
    metrics_path = models.CharField(max_length=256, blank=True)
    metrics_port = models.IntegerField(null=True, blank=True)
    metrics_command = models.CharField(max_length=256, blank=True)
    metrics_args = models.CharField(max_length=1024, blank=True)

    # -- more settings ------------------------------------------------------------------------------------------
    keep_logs = models.BooleanField(
        null=True, blank=True, default=None, help_text="Empty: on for NPU flavors (and when a log path is set)."
    )
    log_export_path = models.CharField(max_length=1024, blank=True, validators=[v.obs_dir_validator("Log path")])
    log_time_range_download = models.BooleanField(default=False)
    auto_stop_hours = models.IntegerField(null=True, blank=True, help_text="Empty: no auto stop.")
    retention_hours = models.IntegerField(null=True, blank=True, help_text="Empty: containers removed at the end.")
    tags = models.JSONField(default=list, blank=True, help_text='[{"key": ..., "value": ...}], at most 20.')

    # Notifications (SPEC §3 "more settings"): a topic and the events sent to it.
    notify_webhook_url = models.URLField(blank=True, max_length=500)
    notify_emails = models.CharField(blank=True, max_length=500, help_text="Comma-separated e-mail addresses.")
    notify_events = models.JSONField(default=list, blank=True)

    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.WORKSPACE)

    # Desired state, written by users; the supervisor converges to it.
    terminate_requested = models.BooleanField(default=False)
    terminate_requested_at = models.DateTimeField(null=True, blank=True)

    # Actual state, written by the supervisor.
    phase = models.CharField(max_length=32, choices=Phase.choices, default=Phase.CREATING)
    phase_reason = models.TextField(blank=True)
    restarts_used = models.PositiveIntegerField(default=0)
    hang_restarts_used = models.PositiveIntegerField(default=0)
    reschedules_used = models.PositiveIntegerField(default=0)
    consecutive_unconditional = models.PositiveIntegerField(default=0)
    consecutive_hang = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    # What happens to the job's outputs once it ended (jobs/runtime/outputs.py), each step once.
    publish_checked_at = models.DateTimeField(
        null=True, blank=True, help_text="When auto-publish ran (whether or not it published)."
    )
    published_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The model version auto-publish created.",
    )  # fmt: skip
    publish_note = models.TextField(blank=True, help_text="Why auto-publish published nothing.")
    logs_exported_at = models.DateTimeField(
        null=True, blank=True, help_text="When the logs were exported to the log path (or the export gave up)."
    )
    logs_export_error = models.TextField(blank=True, help_text="Why the export failed; the logs stay here.")
    logs_deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="When retention deleted the logs (keep logs permanently off)."
    )
    resources_released_at = models.DateTimeField(
        null=True, blank=True, help_text="When the ended job's volumes and code copies were removed from its hosts."
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["workspace", "-created_at"]), models.Index(fields=["phase"])]
        permissions = [
            ("list_all_jobs", "May list all jobs (including creator-only ones)"),
            ("use_high_priority", "May use high priority (3)"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def max_restarts_effective(self) -> int:
        """R of SPEC §4: 0 means fault tolerance off."""
        return self.max_restarts if self.fault_tolerance else 0

    @property
    def is_final(self) -> bool:
        return self.phase in FINAL_PHASES

    @property
    def dedicated(self) -> bool:
        return self.pool_type == self.PoolType.DEDICATED

    # -- what the runtime and the pages read ---------------------------------------------------------------
    @property
    def notify_email_list(self) -> list[str]:
        return [e.strip() for e in (self.notify_emails or "").split(",") if e.strip()]

    def duration(self):
        if not self.started_at:
            return None
        return (self.ended_at or timezone.now()) - self.started_at

    def environments_masked(self) -> list[dict]:
        """The env vars as pages and the API show them: sensitive values are "******"."""
        return [
            {**env, "value": MASK if env.get("sensitive") else env.get("value", "")}
            for env in self.environments or []
            if isinstance(env, dict)
        ]

    def environment_dict(self) -> dict[str, str]:
        """The user's env vars for the container (unmasked): name -> value."""
        return {e["name"]: str(e.get("value", "")) for e in self.environments or [] if isinstance(e, dict)}

    def resource_limits(self) -> dict | None:
        """cpus, memory_mb and gpus of each instance: the custom spec or the flavor; None: unlimited."""
        if self.dedicated and self.spec_type == self.SpecType.CUSTOM and self.custom_cpus:
            return {
                "cpus": self.custom_cpus,
                "memory_mb": int((self.custom_memory_gb or 0) * 1024),
                "gpus": self.custom_gpus or 0,
            }
        if self.flavor_id:
            return {"cpus": self.flavor.cpus, "memory_mb": self.flavor.memory_mb, "gpus": self.flavor.gpus}
        return None

    @property
    def code_folder(self) -> str:
        """The last folder of the code dir: the code appears at ${MA_JOB_DIR}/<folder> (SPEC §8)."""
        parsed = v.parse_obs_dir(self.code_dir or "")
        if not parsed:
            return ""
        bucket, key = parsed
        return key.rstrip("/").rsplit("/", 1)[-1] if key else bucket

    def runtime_layout(self) -> list:
        """The runtime environment preview (SPEC §3): what the job will see where, before it is
        submitted; the same entries the containers are created from (jobs/runtime/layout.py)."""
        from jobs.runtime.layout import runtime_layout

        return runtime_layout(self)

    @property
    def publish_version(self) -> str:
        """The version auto-publish will create: V1 for a new model, previous + 1 otherwise."""
        if self.publish_as == self.PublishAs.VERSION and self.publish_model_id:
            return f"V{self.publish_model.next_version_number()}"
        return "V1"

    def publish_final_model(self) -> ModelVersion:
        """Publish the job's artifacts as a model asset version (auto-publish at completion, or by hand)."""
        from django.db import transaction

        with transaction.atomic():
            if self.publish_as == self.PublishAs.VERSION and self.publish_model_id:
                model = Model.objects.select_for_update().get(id=self.publish_model_id)
            else:
                model, _ = Model.objects.get_or_create(
                    owner_id=self.created_by_id,
                    name=self.model_name,
                    defaults={
                        "type": self.model_type or Model.Type.OTHER,
                        "brand": self.model_brand,
                        "description": self.model_description,
                    },
                )
                model = Model.objects.select_for_update().get(id=model.id)
            return ModelVersion.objects.create(
                model=model,
                number=model.next_version_number(),
                description=self.version_description,
                job=self,
                artifact_path=self.artifact_path,
            )


def _name_the_field_in_length_messages(model) -> None:
    """Django's max_length message does not say which field it is about; ours do."""
    for f in model._meta.fields:
        for validator in f.validators:
            if isinstance(validator, MaxLengthValidator):
                validator.message = (
                    f"{capfirst(f.verbose_name)} may have at most %(limit_value)d characters (it has %(show_value)d)."
                )


_name_the_field_in_length_messages(TrainingJob)

# Datasets appear read-only under this folder, one sub-folder per dataset in the job's order.
DATA_MOUNT_ROOT = "/home/ma-user/modelarts/inputs"
