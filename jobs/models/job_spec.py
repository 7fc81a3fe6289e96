"""The fields of TrainingJob from the wizard's first steps (SPEC §3): who owns the job, its mode
and basic information, training, resources and data.

An abstract mixin, so that the model's fields stay in one table and one migration history;
TrainingJob (jobs/models/job.py) inherits it."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from jobs import validators as v

from .catalogue import (
    Flavor,
    Model,
    PresetImage,
    PresetTemplate,
    ProcessorKind,
    ResourcePool,
    Workspace,
)


class JobSpecFields(models.Model):
    """Identity, mode and basic information, training, resources and data."""

    class TrainingMode(models.TextChoices):
        CUSTOM = "custom", _("Custom job")
        FINETUNE = "finetune", _("Fine-tuning job")

    class ImageSource(models.TextChoices):
        PRESET = "preset", _("Preset image")
        CUSTOM = "custom", _("Custom image")

    class PoolType(models.TextChoices):
        PUBLIC = "public", _("Public resource pool")
        DEDICATED = "dedicated", _("Dedicated resource pool")

    class SpecType(models.TextChoices):
        PRESET = "preset", _("Preset flavor")
        CUSTOM = "custom", _("Custom spec")

    class Affinity(models.TextChoices):
        AFFINITY = "affinity", _("Node affinity")
        ANTI_AFFINITY = "anti_affinity", _("Node anti-affinity")

    class AffinityStrength(models.TextChoices):
        REQUIRED = "required", _("Strong (required)")
        PREFERRED = "preferred", _("Weak (preferred)")

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
        error_messages={"invalid_choice": _("Training mode must be custom or finetune; got %(value)r.")},
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
        error_messages={"invalid_choice": _("Image source must be preset or custom; got %(value)r.")},
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
        error_messages={"invalid_choice": _("Image kind must be cpu, gpu or npu; got %(value)r.")},
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
        validators=[v.obs_dir_validator(_("Code dir"))],
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
        validators=[v.obs_dir_validator(_("Code backup dir"))],
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
        error_messages={"invalid_choice": _("Pool type must be public or dedicated; got %(value)r.")},
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
        error_messages={"invalid_choice": _("Spec type must be preset or custom; got %(value)r.")},
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
        error_messages={"invalid_choice": _("Affinity must be affinity or anti_affinity (empty: off); got %(value)r.")},
        verbose_name=_("affinity"),
        help_text=_("Dedicated pools: run on (affinity) or away from (anti-affinity) the hosts below."),
    )
    affinity_strength = models.CharField(
        max_length=16,
        choices=AffinityStrength.choices,
        default=AffinityStrength.REQUIRED,
        error_messages={"invalid_choice": _("Affinity strength must be required or preferred; got %(value)r.")},
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

    class Meta:
        abstract = True
