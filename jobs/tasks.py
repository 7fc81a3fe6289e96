"""Celery tasks: thin, take ids, and are safe to run twice (see jobs.runtime).

The runtime queues them through jobs/runtime/later.py (one typed function each), so this
module imports the runtime inside each task: the runtime imports this one.
"""

import logging
import os

from celery import shared_task
from django.db import OperationalError

log = logging.getLogger(__name__)


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
def stop_instance(task_run_id: int) -> bool:
    from jobs.runtime import stop

    return stop.stop_outliving_instance(task_run_id)


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


# Queued once, when an attempt has run STANDBY_AFTER_S (start.py): nothing else makes a standby
# again, so a database that did not answer (a pool taken for its whole timeout, a restart of
# PostgreSQL) is retried here; an engine that refused is not (the restart creates its container).
@shared_task(autoretry_for=(OperationalError,), retry_backoff=2, max_retries=5)
def prepare_standby(attempt_id: int) -> bool:
    """The next attempt's container, made and started while this one runs (jobs/runtime/standby.py);
    idempotent."""
    from jobs.runtime import standby

    made = standby.prepare(attempt_id)
    return standby.arm(attempt_id) or made


@shared_task
def remove_standbys(job_id: str) -> bool:
    """An ended job's standby containers (jobs/runtime/standby.py); idempotent."""
    from jobs.runtime import standby

    return standby.remove_for_job(job_id)


@shared_task
def reconcile() -> list[str]:
    from jobs.runtime import reconcile as reconcile_steps

    return reconcile_steps.reconcile()


# Base of the notification retry backoff: retry n waits base * 2**(n-1) s (2, 4, 8, 16, 32 s by default).
NOTIFY_BACKOFF_S = float(os.environ.get("CONSOLE_NOTIFY_BACKOFF_S", "2"))
# One try and five retries, then the notification is given up (FAILED, with the last error).
NOTIFY_MAX_RETRIES = 5
# How long a worker holds a notification while it sends it: longer than any send takes (a webhook
# gives up after 5 s connecting and 5 s reading), so only a holder that died loses it to another.
NOTIFY_CLAIM_S = 60


def notify_retry_delay_s(tries: int) -> float:
    """The wait before the next try of a notification tried `tries` times (retry n = tries)."""
    return NOTIFY_BACKOFF_S * 2 ** (tries - 1)


@shared_task
def deliver_notification(notification_id: int) -> bool:
    """Send one notification if it is due and nobody else holds it; whether this call sent it.

    The row is the outbox (jobs.models.Notification): a failed try moves `next_try_at` by the
    backoff and the reconcile step queues this task again then, so a retry survives the loss of
    its worker or of the broker (a Celery countdown would live only in the broker). Queued twice,
    or given a row another worker is sending, it does nothing.
    """
    from django.db.models import Q
    from django.utils import timezone

    from jobs.models import Notification
    from jobs.notify import TRANSPORTS, TransportError

    now = timezone.now()
    # The claim: one conditional UPDATE, so of two workers at the same moment one wins.
    claimed = (
        Notification.objects.filter(id=notification_id, status=Notification.Status.PENDING, next_try_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claimed_until=now + timezone.timedelta(seconds=NOTIFY_CLAIM_S))
    )
    if claimed != 1:
        return False
    notification = Notification.objects.select_related("event__job__workspace").get(id=notification_id)
    transport = TRANSPORTS[notification.transport]()
    tries = notification.tries + 1
    try:
        transport.send(notification.target, notification.event)
    except Exception as exc:
        if isinstance(exc, TransportError):
            error, retry = str(exc), exc.retry
        else:
            # Not a failure the transport knows (a bug, a broken mail backend): a try all the same,
            # so that it too ends given up with its reason, not retried for ever.
            log.exception("notification %s: sending failed", notification.id)
            error, retry = f"{type(exc).__name__}: {exc}", True
        give_up = tries > NOTIFY_MAX_RETRIES or not retry
        Notification.objects.filter(id=notification.id, status=Notification.Status.PENDING).update(
            tries=tries,
            last_error=error,
            status=Notification.Status.FAILED if give_up else Notification.Status.PENDING,
            next_try_at=timezone.now() + timezone.timedelta(seconds=notify_retry_delay_s(tries)),
            claimed_until=None,
        )
        return False
    Notification.objects.filter(id=notification.id, status=Notification.Status.PENDING).update(
        status=Notification.Status.SENT, tries=tries, sent_at=timezone.now(), last_error="", claimed_until=None
    )
    return True
