"""The fields of TrainingJob from the wizard's storage step (SPEC §3): training artifacts and
auto-publishing them as a model asset. TrainingJob (jobs/models/job.py) inherits the mixin."""

from __future__ import annotations

from django.db import models
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from jobs import validators as v
from jobs.i18n import lazy_fill

from .catalogue import Model


class JobPublishFields(models.Model):
    """Where the job's outputs are kept, and the model version they become."""

    class PublishAs(models.TextChoices):
        NEW = "new", _("New model")
        VERSION = "version", _("New version of an existing model")

    # -- storage (training artifacts and publishing) -----------------------------------------------------------
    store_artifacts = models.BooleanField(
        default=False,
        verbose_name=_("store training artifacts"),
        help_text=_("Keep the job's outputs in object storage; the mount survives restarts (checkpoints)."),
    )
    artifact_path = models.CharField(
        max_length=1024,
        blank=True,
        validators=[v.obs_dir_validator(_("Artifact storage path"))],
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
        error_messages={"invalid_choice": _("Publish as must be new or version; got %(value)r.")},
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
        error_messages={
            "invalid_choice": lazy_fill(_("Model type must be one of %(types)s."), types=", ".join(Model.Type.values))
        },
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

    class Meta:
        abstract = True
