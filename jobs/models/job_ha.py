"""The fields of TrainingJob for high availability (SPEC §4) and hang detection (SPEC §6).
TrainingJob (jobs/models/job.py) inherits the mixin; the counters of what was used stay there,
with the rest of the state the supervisor writes."""

from __future__ import annotations

from django.db import models
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from faulttolerance.policy import MAX_CONSECUTIVE_HANG, MAX_CONSECUTIVE_UNCONDITIONAL
from jobs import validators as v


class JobHAFields(models.Model):
    """Fault tolerance (automatic restart) and the hang detection window."""

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

    class Meta:
        abstract = True
