"""Celery tasks: thin, take ids, and are safe to run twice (see jobs.runtime).

The runtime queues them through jobs/runtime/later.py (one typed function each), so this
module imports the runtime inside each task: the runtime imports this one.
"""

import os

from celery import shared_task


@shared_task
def schedule_job(job_id: str) -> bool:
    from jobs.runtime import schedule

    return schedule.schedule_job(job_id)


@shared_task
def start_attempt(attempt_id: int) -> bool:
    from jobs.runtime import start

    return start.start_attempt(attempt_id)


@shared_task
def follow_task_run(task_run_id: int, drain: bool = False) -> bool:
    from jobs.runtime import follow

    return follow.follow_task_run(task_run_id, drain=drain)


@shared_task
def end_attempt(attempt_id: int) -> bool:
    from jobs.runtime import decide

    return decide.attempt_may_have_ended(attempt_id)


@shared_task
def stop_job(job_id: str) -> bool:
    from jobs.runtime import stop

    return stop.stop_job(job_id)


@shared_task
def job_outputs(job_id: str) -> bool:
    from jobs.runtime import outputs

    return outputs.complete_outputs(job_id)


@shared_task
def delete_job_logs(job_id: str) -> bool:
    from jobs.runtime import outputs

    return outputs.delete_logs(job_id)


@shared_task
def release_job_resources(job_id: str) -> bool:
    """An ended job's volumes and code copies on its hosts (jobs/runtime/cleanup.py); idempotent."""
    from jobs.runtime import cleanup

    return cleanup.release_job_resources(job_id)


@shared_task
def reconcile() -> list[str]:
    from jobs.runtime import reconcile as reconcile_steps

    return reconcile_steps.reconcile()


# Base of the notification retry backoff: retry n waits base * 2**(n-1) s (2, 4, 8, 16, 32 s by default).
NOTIFY_BACKOFF_S = float(os.environ.get("CONSOLE_NOTIFY_BACKOFF_S", "2"))


@shared_task(bind=True, max_retries=5)
def deliver_notification(self, notification_id: int) -> bool:
    """Send one notification; retried with backoff (NOTIFY_BACKOFF_S doubled each time)."""
    from django.utils import timezone

    from jobs.models import Notification
    from jobs.notify import TRANSPORTS, TransportError

    notification = Notification.objects.select_related("event__job__workspace").filter(id=notification_id).first()
    if notification is None or notification.status != Notification.Status.PENDING:
        return False
    transport = TRANSPORTS[notification.transport]()
    try:
        transport.send(notification.target, notification.event)
    except TransportError as exc:
        tries = notification.tries + 1
        give_up = self.request.retries >= self.max_retries or not exc.retry
        Notification.objects.filter(id=notification.id).update(
            tries=tries,
            last_error=str(exc),
            status=Notification.Status.FAILED if give_up else Notification.Status.PENDING,
        )
        if give_up:
            return False
        raise self.retry(countdown=NOTIFY_BACKOFF_S * 2**self.request.retries) from exc
    Notification.objects.filter(id=notification.id, status=Notification.Status.PENDING).update(
        status=Notification.Status.SENT, tries=notification.tries + 1, sent_at=timezone.now(), last_error=""
    )
    return True
