"""The fields of TrainingJob from the wizard's access and observe steps (SPEC §3): how users reach
into a running job (JupyterLab, SSH) and what it reports (TensorBoard, Prometheus metrics).
TrainingJob (jobs/models/job.py) inherits the mixin."""

from __future__ import annotations

from django.db import models
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from jobs import validators as v

from .catalogue import FileSystem, KeyPair


class JobObserveFields(models.Model):
    """Access to a running job and what it reports."""

    class MetricsMode(models.TextChoices):
        HTTP = "http", _("HTTP")
        COMMAND = "command", _("Command")

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
        validators=[v.validate_directory(_("Mutual-trust SSH files dir"))],
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
        validators=[v.mount_path_validator(_("Summary path"))],
        verbose_name=_("summary path"),
        help_text=format_lazy(_("Default {path}."), path=v.DEFAULT_SUMMARY_PATH),
    )
    metrics_mode = models.CharField(
        max_length=16,
        choices=MetricsMode.choices,
        blank=True,
        error_messages={"invalid_choice": _("Metrics mode must be http or command (empty: off); got %(value)r.")},
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

    class Meta:
        abstract = True
