"""The training job: what the user asked for (SPEC §3) and where it stands."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxLengthValidator
from django.db import models
from django.utils import timezone
from django.utils.text import capfirst, format_lazy
from django.utils.translation import gettext_lazy as _

from faulttolerance.policy import MAX_CONSECUTIVE_HANG, MAX_CONSECUTIVE_UNCONDITIONAL
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
    workspace = models.ForeignKey(
        Workspace,
        on_delete=models.CASCADE,
        related_name="jobs",
        verbose_name=_("workspace"),
        help_text=_("The workspace the job belongs to (the API's project_id); its members see it."),
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")

    # -- mode and basic information ---------------------------------------------------------------
    training_mode = models.CharField(
        max_length=16,
        choices=TrainingMode.choices,
        default=TrainingMode.CUSTOM,
        error_messages={"invalid_choice": "Training mode must be custom or finetune; got %(value)r."},
        verbose_name=_("training mode"),
        help_text=_("Custom: your own code. Fine-tuning: starts from a preset template or a model asset."),
    )
    base_model = models.ForeignKey(
        Model,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="finetune_jobs",
        verbose_name=_("base model"),
        help_text=_("Fine-tuning: one of your model assets to start from."),
    )
    name = models.CharField(
        max_length=v.JOB_NAME_MAX,
        blank=True,
        validators=[v.job_name_validator],
        verbose_name=_("name"),
        help_text=v.JOB_NAME_RULE,
    )
    description = models.CharField(
        max_length=v.DESCRIPTION_MAX,
        blank=True,
        validators=[v.validate_description],
        verbose_name=_("description"),
        help_text=format_lazy(_("Optional: {rule}."), rule=v.DESCRIPTION_RULE),
    )

    # -- training ------------------------------------------------------------------------------------
    preset_template = models.ForeignKey(
        PresetTemplate,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        verbose_name=_("preset template"),
        help_text=_("Optional: fills description, image, command, code dir, local code dir and env vars."),
    )
    image_source = models.CharField(
        max_length=16,
        choices=ImageSource.choices,
        default=ImageSource.CUSTOM,
        error_messages={"invalid_choice": "Image source must be preset or custom; got %(value)r."},
        verbose_name=_("image source"),
        help_text=_("A preset image registered by the operator, or your own image reference."),
    )
    preset_image = models.ForeignKey(
        PresetImage,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
        verbose_name=_("preset image"),
        help_text=_("Registered by the operator; needs a code dir."),
    )
    image = models.CharField(
        max_length=255,
        blank=True,
        validators=[v.image_reference_validator],
        verbose_name=_("image"),
        help_text=_("A custom image reference (no registry is reachable: the image must be on the hosts)."),
    )
    image_kind = models.CharField(
        max_length=8,
        choices=ProcessorKind.choices,
        blank=True,
        error_messages={"invalid_choice": "Image kind must be cpu, gpu or npu; got %(value)r."},
        verbose_name=_("custom image type"),
        help_text=_("What the custom image is built for; on the public pool it must match the flavor."),
    )
    command = models.TextField(
        blank=True,
        verbose_name=_("start command"),
        help_text=_("Runs inside the container with sh -c; ';' and '&&' chains allowed."),
    )
    code_dir = models.CharField(
        max_length=1024,
        blank=True,
        validators=[v.obs_dir_validator("Code dir")],
        verbose_name=_("code dir"),
        help_text=format_lazy(
            _(
                "obs://bucket/path/ (ending in '/'); required with a preset image; at most {gb} GB, {files} files, "
                "{depth} levels deep. Appears at ${{MA_JOB_DIR}}/<last folder>."
            ),
            gb=v.CODE_DIR_MAX_BYTES // 1024**3,
            files=v.CODE_DIR_MAX_FILES,
            depth=v.CODE_DIR_MAX_DEPTH,
        ),
    )
    code_backup_dir = models.CharField(
        max_length=1024,
        blank=True,
        validators=[v.obs_dir_validator("Code backup dir")],
        verbose_name=_("code backup dir"),
        help_text=_(
            "Optional obs:// folder: the local code folder is copied to "
            "<dir>/<job>-<task>-<index>/user-job-dir/<folder> at start."
        ),
    )
    local_code_dir = models.CharField(
        max_length=1024,
        default=v.DEFAULT_LOCAL_CODE_DIR,
        validators=[v.validate_local_code_dir],
        verbose_name=_("local code dir"),
        help_text=format_lazy(
            _("Default {default}; not {forbidden} nor under {trees}."),
            default=v.DEFAULT_LOCAL_CODE_DIR,
            forbidden=v.LOCAL_CODE_DIR_FORBIDDEN,
            trees=", ".join(tree + "/" for tree in v.LOCAL_CODE_DIR_FORBIDDEN_TREES),
        ),
    )
    environments = models.JSONField(
        default=list,
        blank=True,
        verbose_name=_("env vars"),
        help_text=format_lazy(_("At most {max}; names like MY_VAR."), max=v.ENV_MAX),
    )

    # -- resources ----------------------------------------------------------------------------------------
    pool_type = models.CharField(
        max_length=16,
        choices=PoolType.choices,
        default=PoolType.PUBLIC,
        error_messages={"invalid_choice": "Pool type must be public or dedicated; got %(value)r."},
        verbose_name=_("resource pool type"),
        help_text=_("Public: shared hosts. Dedicated: a pool of hosts, with the options below."),
    )
    pool = models.ForeignKey(
        ResourcePool,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
        verbose_name=_("resource pool"),
        help_text=_("Free nodes, CPUs, memory and GPUs per pool; fragmentation: free capacity on partly used nodes."),
    )
    spec_type = models.CharField(
        max_length=16,
        choices=SpecType.choices,
        default=SpecType.PRESET,
        error_messages={"invalid_choice": "Spec type must be preset or custom; got %(value)r."},
        verbose_name=_("spec type"),
        help_text=_("Dedicated pools: a preset flavor or a custom spec no larger than the pool's node size."),
    )
    custom_cpus = models.FloatField(
        null=True,
        blank=True,
        verbose_name=_("CPUs"),
        help_text=_("No more than the pool's node size."),
    )
    custom_memory_gb = models.FloatField(
        null=True,
        blank=True,
        verbose_name=_("memory (GB)"),
        help_text=_("No more than the pool's node size."),
    )
    custom_gpus = models.IntegerField(
        null=True,
        blank=True,
        verbose_name=_("GPUs"),
        help_text=_("No more than the pool's node size."),
    )
    node_count = models.PositiveIntegerField(
        default=1,
        verbose_name=_("instance count"),
        help_text=format_lazy(
            _("{min}-{max}; more than 1 runs a distributed job."), min=v.NODE_COUNT_MIN, max=v.NODE_COUNT_MAX
        ),
    )
    flavor = models.ForeignKey(
        Flavor,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
        verbose_name=_("flavor"),
        help_text=_(
            "Must exist; a single-process flavor refuses more than one instance; on the public pool the "
            "image type and flavor type must match (all CPU or all GPU)."
        ),
    )
    affinity = models.CharField(
        max_length=16,
        choices=Affinity.choices,
        blank=True,
        error_messages={"invalid_choice": "Affinity must be affinity or anti_affinity (empty: off); got %(value)r."},
        verbose_name=_("affinity"),
        help_text=_("Dedicated pools: run on (affinity) or away from (anti-affinity) the hosts below."),
    )
    affinity_strength = models.CharField(
        max_length=16,
        choices=AffinityStrength.choices,
        default=AffinityStrength.REQUIRED,
        error_messages={"invalid_choice": "Affinity strength must be required or preferred; got %(value)r."},
        verbose_name=_("affinity strength"),
        help_text=_("Strong: only there (the job waits). Weak: preferred, elsewhere if needed."),
    )
    affinity_hosts = models.JSONField(
        default=list,
        blank=True,
        verbose_name=_("affinity hosts"),
        help_text=_("Hosts of the pool."),
    )
    file_system_mounts = models.JSONField(
        default=list,
        blank=True,
        verbose_name=_("file system mounts"),
        help_text=format_lazy(
            _(
                "At most {max}; a file system may be mounted twice, a mount path only once. "
                "Mount options default to {options}."
            ),
            max=v.MOUNTS_MAX,
            options=v.DEFAULT_NFS_OPTIONS,
        ),
    )
    obs_mounts = models.JSONField(
        default=list,
        blank=True,
        verbose_name=_("object storage mount"),
        help_text=format_lazy(_("At most {max} bucket path."), max=v.OBS_MOUNTS_MAX),
    )
    priority = models.IntegerField(
        default=v.PRIORITY_DEFAULT,
        verbose_name=_("priority"),
        help_text=format_lazy(
            _("Dedicated pools: {min}-{max} ({max} needs the permission 'may use high priority')."),
            min=v.PRIORITY_MIN,
            max=v.PRIORITY_MAX,
        ),
    )
    preemptible = models.BooleanField(
        default=False,
        verbose_name=_("allow preemption"),
        help_text=_("Dedicated pools: the job may be stopped and re-queued to make room."),
    )

    # -- data -----------------------------------------------------------------------------------------------
    datasets = models.JSONField(
        default=list,
        blank=True,
        verbose_name=_("datasets"),
        help_text=format_lazy(_("At most {max}: preset data or your own online data."), max=v.DATASETS_MAX),
    )

    # -- storage (training artifacts and publishing) -----------------------------------------------------------
    store_artifacts = models.BooleanField(
        default=False,
        verbose_name=_("store training artifacts"),
        help_text=_("Keep the job's outputs in object storage; the mount survives restarts (checkpoints)."),
    )
    artifact_path = models.CharField(
        max_length=1024,
        blank=True,
        validators=[v.obs_dir_validator("Artifact storage path")],
        verbose_name=_("artifact storage path"),
        help_text=_("obs://bucket/path/ where the job's outputs are kept."),
    )
    artifact_mount_path = models.CharField(
        max_length=1024,
        default=v.DEFAULT_ARTIFACT_MOUNT_PATH,
        validators=[v.validate_artifact_mount_path],
        verbose_name=_("artifact mount path"),
        help_text=format_lazy(
            _("Letters, digits, '-', '_', '/'; not {forbidden}."),
            forbidden=", ".join(path + "/" for path in v.ARTIFACT_MOUNT_FORBIDDEN if path != "/"),
        ),
    )
    auto_publish = models.BooleanField(
        default=False,
        verbose_name=_("auto-publish the final model"),
        help_text=_("When the job completes, its artifacts become a model asset version."),
    )
    publish_as = models.CharField(
        max_length=16,
        choices=PublishAs.choices,
        default=PublishAs.NEW,
        error_messages={"invalid_choice": "Publish as must be new or version; got %(value)r."},
        verbose_name=_("publish as"),
        help_text=_("A new model (version V1), or the next version of one of your models."),
    )
    model_name = models.CharField(
        max_length=v.MODEL_NAME_MAX,
        blank=True,
        verbose_name=_("model name"),
        help_text=v.MODEL_NAME_RULE,
    )
    model_type = models.CharField(
        max_length=32,
        choices=Model.Type.choices,
        blank=True,
        error_messages={"invalid_choice": "Model type must be one of " + ", ".join(Model.Type.values) + "."},
        verbose_name=_("model type"),
        help_text=_("Text generation, image understanding, image generation, video generation or other."),
    )
    model_brand = models.CharField(
        max_length=64,
        blank=True,
        verbose_name=_("model brand"),
        help_text=_("Optional, e.g. Qwen."),
    )
    model_description = models.CharField(
        max_length=v.MODEL_DESCRIPTION_MAX,
        blank=True,
        verbose_name=_("model description"),
        help_text=format_lazy(_("Required for a new model; up to {max} characters."), max=v.MODEL_DESCRIPTION_MAX),
    )
    publish_model = models.ForeignKey(
        Model,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="publishing_jobs",
        verbose_name=_("existing model"),
        help_text=_("One of your models; the version is the previous one + 1."),
    )
    version_description = models.CharField(
        max_length=v.VERSION_DESCRIPTION_MAX,
        blank=True,
        verbose_name=_("version description"),
        help_text=format_lazy(
            _("Optional, up to {max} characters. The version (V1, or the previous one + 1) is set by the platform."),
            max=v.VERSION_DESCRIPTION_MAX,
        ),
    )

    # High availability (SPEC §4). R is max_restarts when fault tolerance is on, else 0.
    fault_tolerance = models.BooleanField(
        default=False,
        verbose_name=_("fault tolerance (automatic restart)"),
        help_text=_("Off by default. On: failed jobs restart automatically, up to max restarts."),
    )
    max_restarts = models.PositiveIntegerField(
        default=3,
        verbose_name=_("max restarts"),
        help_text=format_lazy(
            _("{min}-{max}, used when fault tolerance is on."), min=v.MAX_RESTARTS_MIN, max=v.MAX_RESTARTS_MAX
        ),
    )
    unconditional_restart = models.BooleanField(
        default=False,
        verbose_name=_("unconditional restart"),
        help_text=format_lazy(
            _("Restart whatever the failure, at most {times} times in a row; consumes max restarts."),
            times=MAX_CONSECUTIVE_UNCONDITIONAL,
        ),
    )
    hang_restart = models.BooleanField(
        default=False,
        verbose_name=_("hang restart"),
        help_text=format_lazy(
            _("Restart a stuck job in place, at most {times} times in a row; does not consume max restarts."),
            times=MAX_CONSECUTIVE_HANG,
        ),
    )
    pod_retry_num = models.PositiveIntegerField(
        default=0,
        verbose_name=_("instance rescheduling count"),
        help_text=format_lazy(
            _("0-{max}: how often one instance of a multi-instance job may move off a lost host."),
            max=v.POD_RETRY_MAX,
        ),
    )
    operator_reexecution = models.BooleanField(
        default=False,
        verbose_name=_("operator re-execution"),
        help_text=_(
            "Retry a failed communication operator (an Ascend feature): passed to the container as "
            "configuration (MA_OPERATOR_REEXECUTION=1); the console does nothing else with it."
        ),
    )

    # Hang detection window (SPEC §6); 0 uses the platform default.
    hang_window_s = models.PositiveIntegerField(
        default=0,
        verbose_name=_("hang detection window (seconds)"),
        help_text=_("Suspected hang after this long without CPU, log or GPU use; empty: platform default."),
    )

    # -- access ----------------------------------------------------------------------------------------------
    jupyter_lab = models.BooleanField(
        default=False,
        verbose_name=_("JupyterLab"),
        help_text=_("Open JupyterLab in the running job."),
    )
    ssh_remote = models.BooleanField(
        default=False,
        verbose_name=_("SSH remote development"),
        help_text=_("Needs a key pair of yours; excludes mutual-trust SSH files."),
    )
    ssh_key_pair = models.ForeignKey(
        KeyPair,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        verbose_name=_("key pair"),
        help_text=_("One of your key pairs."),
    )
    mutual_trust = models.BooleanField(
        default=False,
        verbose_name=_("generate mutual-trust SSH files"),
        help_text=format_lazy(
            _("Directory default {dir}; excludes SSH remote development."), dir=v.DEFAULT_MUTUAL_TRUST_DIR
        ),
    )
    mutual_trust_dir = models.CharField(
        max_length=1024,
        default=v.DEFAULT_MUTUAL_TRUST_DIR,
        validators=[v.validate_directory("Mutual-trust SSH files dir")],
        verbose_name=_("mutual-trust SSH files dir"),
        help_text=format_lazy(_("Default {dir}."), dir=v.DEFAULT_MUTUAL_TRUST_DIR),
    )

    # -- observe -----------------------------------------------------------------------------------------------
    tensorboard = models.BooleanField(
        default=False,
        verbose_name=_("TensorBoard"),
        help_text=_("Dedicated pools; needs a file system; excludes MindStudio Insight."),
    )
    mindstudio_insight = models.BooleanField(
        default=False,
        verbose_name=_("MindStudio Insight"),
        help_text=_("Dedicated pools; needs a file system; excludes TensorBoard."),
    )
    observe_file_system = models.ForeignKey(
        FileSystem,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="observing_jobs",
        verbose_name=_("summary file system"),
        help_text=_("Dedicated pools: the file system the summaries are written to."),
    )
    observe_path = models.CharField(
        max_length=1024,
        default=v.DEFAULT_SUMMARY_PATH,
        validators=[v.mount_path_validator("Summary path")],
        verbose_name=_("summary path"),
        help_text=format_lazy(_("Default {path}."), path=v.DEFAULT_SUMMARY_PATH),
    )
    metrics_mode = models.CharField(
        max_length=16,
        choices=MetricsMode.choices,
        blank=True,
        error_messages={"invalid_choice": "Metrics mode must be http or command (empty: off); got %(value)r."},
        verbose_name=_("Prometheus metrics"),
        help_text=_("Off, by HTTP (URL path + port inside the container) or by command."),
    )
    metrics_path = models.CharField(
        max_length=256,
        blank=True,
        verbose_name=_("metrics URL path"),
        help_text=_("e.g. /metrics"),
    )
    metrics_port = models.IntegerField(
        null=True,
        blank=True,
        verbose_name=_("metrics port"),
        help_text=format_lazy(_("{min}-{max}, inside the container."), min=v.PORT_MIN, max=v.PORT_MAX),
    )
    metrics_command = models.CharField(
        max_length=256,
        blank=True,
        verbose_name=_("metrics command"),
        help_text=_("Prints Prometheus text within seconds, e.g. 'cat'."),
    )
    metrics_args = models.CharField(
        max_length=1024,
        blank=True,
        verbose_name=_("metrics command arguments"),
        help_text=_("Arguments of the metrics command."),
    )

    # -- more settings ------------------------------------------------------------------------------------------
    keep_logs = models.BooleanField(
        null=True,
        blank=True,
        default=None,
        verbose_name=_("keep logs permanently"),
        help_text=_("On by default for NPU flavors. Off: logs are deleted 30 days after the job ends."),
    )
    log_export_path = models.CharField(
        max_length=1024,
        blank=True,
        validators=[v.obs_dir_validator("Log path")],
        verbose_name=_("log path"),
        help_text=_("obs://bucket/path/; required when logs are kept permanently."),
    )
    log_time_range_download = models.BooleanField(
        default=False,
        verbose_name=_("log download by time range"),
        help_text=_("Allow downloading a time range of the log."),
    )
    auto_stop_hours = models.IntegerField(
        null=True,
        blank=True,
        verbose_name=_("auto stop after (hours)"),
        help_text=format_lazy(
            _("Empty: off. {presets} or a custom {min}-{max} hours; time queued does not count."),
            presets=", ".join(str(hours) for hours in v.HOUR_PRESETS),
            min=v.HOURS_MIN,
            max=v.HOURS_MAX,
        ),
    )
    retention_hours = models.IntegerField(
        null=True,
        blank=True,
        verbose_name=_("retention (hours)"),
        help_text=format_lazy(
            _("Dedicated pools: keep the containers {min}-{max} hours after the end; not with fault tolerance."),
            min=v.HOURS_MIN,
            max=v.HOURS_MAX,
        ),
    )
    tags = models.JSONField(
        default=list,
        blank=True,
        verbose_name=_("tags"),
        help_text=format_lazy(_("At most {max} key/value pairs with unique keys."), max=v.TAGS_MAX),
    )

    # Notifications (SPEC §3 "more settings"): a topic and the events sent to it.
    notify_webhook_url = models.URLField(
        blank=True,
        max_length=500,
        verbose_name=_("webhook URL"),
        help_text=_("Receives a JSON POST per subscribed event (retried on failure)."),
    )
    notify_emails = models.CharField(
        blank=True,
        max_length=500,
        verbose_name=_("e-mail addresses"),
        help_text=_("Comma-separated."),
    )
    notify_events = models.JSONField(
        default=list,
        blank=True,
        verbose_name=_("notify on"),
        help_text=_("Sent to the webhook and the e-mail addresses."),
    )

    visibility = models.CharField(
        max_length=16,
        choices=Visibility.choices,
        default=Visibility.WORKSPACE,
        verbose_name=_("visible to"),
        help_text=_("Workspace members (default), or only you (and those who may list all jobs)."),
    )

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
    """Django's max_length message does not say which field it is about; ours do.

    The field is named after its attribute (as before fields had verbose names), not its
    lazily translated label: the messages stay exactly what the API has always said."""
    for f in model._meta.fields:
        for validator in f.validators:
            if isinstance(validator, MaxLengthValidator):
                name = capfirst(f.name.replace("_", " "))
                validator.message = f"{name} may have at most %(limit_value)d characters (it has %(show_value)d)."


_name_the_field_in_length_messages(TrainingJob)

# Datasets appear read-only under this folder, one sub-folder per dataset in the job's order.
DATA_MOUNT_ROOT = "/home/ma-user/modelarts/inputs"
