"""Events of a job and the notifications that carry them."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


class EventKind(models.TextChoices):
    # The labels are what pages, e-mails and the wizard's event choices show, in their language.
    STARTED = "started", pgettext_lazy("event", "Started")
    COMPLETED = "completed", pgettext_lazy("event", "Completed")
    FAILED = "failed", pgettext_lazy("event", "Failed")
    TERMINATED = "terminated", pgettext_lazy("event", "Terminated")
    SUSPECTED_HANG = "suspected_hang", _("suspected hang")
    RESTARTED = "restarted", pgettext_lazy("event", "Restarted")
    PREEMPTED = "preempted", pgettext_lazy("event", "Preempted")
    RESCHEDULED = "rescheduled", _("Rescheduled")
    HOST_ISOLATED = "host_isolated", _("host isolated")
    ENV_CHECK_FAILED = "env_check_failed", _("environment check failed")
    # What happened to the job's outputs after it ended (jobs/runtime/outputs.py).
    MODEL_PUBLISHED = "model_published", _("model published")
    MODEL_NOT_PUBLISHED = "model_not_published", _("model not published")
    LOGS_EXPORTED = "logs_exported", _("logs exported")
    LOGS_EXPORT_FAILED = "logs_export_failed", _("log export failed")
    LOGS_DELETED = "logs_deleted", _("logs deleted")
    TERMINAL_OPENED = "terminal_opened", _("terminal opened")  # who opened a shell in which instance (jobs/terminal.py)


# Events a user may subscribe a notification topic to (SPEC §3 "notifications").
NOTIFIABLE_EVENTS = [
    EventKind.STARTED,
    EventKind.COMPLETED,
    EventKind.FAILED,
    EventKind.TERMINATED,
    EventKind.SUSPECTED_HANG,
    EventKind.RESTARTED,
    EventKind.PREEMPTED,
]


class JobEvent(models.Model):
    """Something that happened to a job: the Events tab, and what notifications carry."""

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    at = models.DateTimeField(default=timezone.now)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["job", "-at"])]

    def __str__(self) -> str:
        return f"{self.job} {self.kind}"


class Notification(models.Model):
    """One delivery of one event to one target, and its outbox row: retried until sent or given up.

    The row, not a broker message, is the promise: a message lost with a worker or the broker
    leaves the row PENDING, and the reconcile step (jobs/runtime/reconcile.py) queues it again
    once `next_try_at` is due and nobody holds it (docs/decisions.md, "an outbox").
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"

    event = models.ForeignKey(JobEvent, on_delete=models.CASCADE, related_name="notifications")
    transport = models.CharField(max_length=16)  # a key of jobs.notify.TRANSPORTS
    target = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # When the next try may be made: now for the first, then the retry backoff (jobs/tasks.py).
    next_try_at = models.DateTimeField(default=timezone.now)
    # A worker sending it holds it until then (a conditional UPDATE takes it), so two workers given
    # the same row never send it at the same moment; a holder that dies lets go when this passes.
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["event", "transport", "target"], name="unique_notification_target")
        ]
        # The reconcile step's question, "which pending rows are due": sent rows, nearly all of
        # them, are not in the index.
        indexes = [models.Index(fields=["next_try_at"], condition=models.Q(status="pending"), name="notification_due")]
