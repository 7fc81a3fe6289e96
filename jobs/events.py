"""Recording job events and fanning them out to the job's notification topic."""

from __future__ import annotations

import logging

from django.db import transaction

from console import realtime

from .models import JobEvent, Notification, TrainingJob

log = logging.getLogger(__name__)


def record(job: TrainingJob, kind: str, message: str, **data) -> JobEvent:
    """Store an event; after commit, push it to live pages and queue its notifications."""
    # The job as this transaction sees it now (the caller's object may be stale).
    snapshot = TrainingJob.objects.filter(id=job.id).values("phase", "restarts_used", "hang_restarts_used").first()
    event = JobEvent.objects.create(job=job, kind=kind, message=message, data=data | {"job_at_event": snapshot or {}})
    targets = []
    if kind in (job.notify_events or []):
        if job.notify_webhook_url:
            targets.append(("webhook", job.notify_webhook_url))
        targets += [("email", address) for address in job.notify_email_list]
    notifications = Notification.objects.bulk_create(
        Notification(event=event, transport=transport, target=target) for transport, target in targets
    )

    def after_commit() -> None:
        realtime.publish(realtime.job_group(job.id), {"type": "job.changed"})
        from . import tasks

        # The fast path only: the rows are the outbox, and what is not queued here (the broker is
        # down) the reconcile step queues later. A failure must not reach the caller, whose
        # transaction (a job's state change) has committed already.
        for notification in notifications:
            try:
                tasks.deliver_notification.delay(notification.id)
            except Exception:
                log.warning(
                    "event %s: could not queue %d notification(s); the reconcile step will",
                    event.id,
                    len(notifications),
                    exc_info=True,
                )
                break  # the broker is down for the rest too: each would wait out the publish retries

    transaction.on_commit(after_commit)
    return event
