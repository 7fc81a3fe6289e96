"""The fields of TrainingJob from the wizard's "more settings" step (SPEC §3): logs, auto stop,
retention, tags, notifications and who sees the job. TrainingJob (jobs/models/job.py) inherits
the mixin."""

from __future__ import annotations

from django.db import models
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from jobs import validators as v


class JobSettingsFields(models.Model):
    """Logs, auto stop, retention, tags, notifications and visibility."""

    class Visibility(models.TextChoices):
        WORKSPACE = "workspace", _("Workspace members")
        CREATOR = "creator", _("Only the creator")

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
        validators=[v.obs_dir_validator(_("Log path"))],
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

    class Meta:
        abstract = True
