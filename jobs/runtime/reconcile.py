"""Periodic steps that make the supervisor crash-safe.

Each step looks for work a dead or slow worker left behind, hands it to the
idempotent task that does it, and returns whether it found any (tested one by
one, like healthchecks' sendalerts loop).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from jobs.models import RETAINED_PHASES, Attempt, DockerHost, Phase, TaskRun, TrainingJob

from . import later
from .cleanup import release_ended_jobs, scan_for_orphans_when_due

log = logging.getLogger(__name__)

STARTING_GRACE_S = 15
TERMINATING_GRACE_S = 20
HOST_PING_TIMEOUT_S = 3


def schedule_pending_jobs() -> bool:
    """Jobs waiting for hosts (or whose schedule message was lost): one task per queue
    (a dedicated pool, or the public pools), which schedules that queue in order."""
    heads: dict[tuple[str, int | None], str] = {}
    pending = TrainingJob.objects.filter(phase=Phase.PENDING).order_by("-priority", "created_at", "id")
    for job_id, pool_type, pool_id in pending.values_list("id", "pool_type", "pool_id")[:1000]:
        key = (pool_type, pool_id if pool_type == TrainingJob.PoolType.DEDICATED else None)
        heads.setdefault(key, str(job_id))
    for job_id in heads.values():
        later.schedule_job(job_id)
    return bool(heads)


def restart_stuck_starts() -> bool:
    """Attempts whose start task died half-way (start_attempt is idempotent)."""
    cutoff = timezone.now() - timezone.timedelta(seconds=STARTING_GRACE_S)
    ids = list(Attempt.objects.filter(state=Attempt.State.STARTING, created_at__lt=cutoff).values_list("id", flat=True))
    for attempt_id in ids:
        later.start_attempt(attempt_id)
    return bool(ids)


UNDECIDED_GRACE_S = 3


def drain_dead_followers() -> bool:
    """Runs whose container ended while their follower was dead (its worker was killed), or that
    never took their container for good (TaskRun.drainable): the lines the container wrote after
    the last one taken are persisted by a new follower, which then removes the container (nothing
    else would: a followed run is not an orphan)."""
    stale = timezone.now() - timezone.timedelta(seconds=settings.FOLLOWER_STALE_AFTER_S)
    # Not when a later run restarted in the same container: its follower reads that container.
    restarted_in_place = TaskRun.later_in_its_container(
        OuterRef("container_id"), OuterRef("attempt__job_id"), OuterRef("attempt__number")
    )
    ids = list(
        TaskRun.objects.filter(TaskRun.drainable(), follower_token__isnull=False)
        .filter(Q(follower_heartbeat__isnull=True) | Q(follower_heartbeat__lt=stale))
        .exclude(Exists(restarted_in_place))
        .values_list("id", flat=True)[:100]
    )
    for task_run_id in ids:
        later.follow_task_run(task_run_id, drain=True)
    return bool(ids)


def end_decided_attempts() -> bool:
    """Attempts whose end was never decided: every instance ended, or one failed (which ends
    the attempt), and no decision followed (the deciding worker died, or its task was lost;
    a decision rolled back with its worker leaves the attempt running). Deciding is
    idempotent: the live path may win the race, and this then does nothing."""
    all_ended = Attempt.objects.filter(state=Attempt.State.RUNNING).exclude(
        task_runs__state__in=[TaskRun.State.CREATED, TaskRun.State.RUNNING]
    )
    cutoff = timezone.now() - timezone.timedelta(seconds=UNDECIDED_GRACE_S)
    failed_runs = TaskRun.objects.filter(attempt__state=Attempt.State.RUNNING, ended_at__lt=cutoff).filter(
        Q(state__in=[TaskRun.State.START_FAILED, TaskRun.State.LOST])
        | Q(hung=True, state=TaskRun.State.EXITED)
        | Q(state=TaskRun.State.EXITED, exit_code__isnull=True)
        | (Q(state=TaskRun.State.EXITED) & ~Q(exit_code=0))
    )
    ids = set(all_ended.values_list("id", flat=True)) | set(failed_runs.values_list("attempt_id", flat=True))
    for attempt_id in sorted(ids):
        later.end_attempt(attempt_id)
    return bool(ids)


def finish_terminations() -> bool:
    """Stops that did not complete (the stop task's worker died)."""
    cutoff = timezone.now() - timezone.timedelta(seconds=TERMINATING_GRACE_S)
    ids = list(
        TrainingJob.objects.filter(phase=Phase.TERMINATING, terminate_requested_at__lt=cutoff).values_list(
            "id", flat=True
        )
    )
    for job_id in ids:
        later.stop_job(str(job_id))
    return bool(ids)


OUTLIVED_RESTOP_S = 60


def stop_instances_of_ended_attempts() -> bool:
    """Instances still running OUTLIVED_STOP_GRACE_S after their attempt ended, in containers no later
    attempt took over (TaskRun.outliving_their_attempt): the decision's stop was lost (its
    worker died between the commit and the stop, the engine failed it, a start that raced a
    Stop marked them running after). Whoever follows them, here or on another worker, records
    the end once they are stopped. Each is asked once a minute at most (claimed with a
    conditional update): a wedged engine must not fill the control queue with stops."""
    now = timezone.now()
    cutoff = now - timezone.timedelta(seconds=settings.OUTLIVED_STOP_GRACE_S)
    again = now - timezone.timedelta(seconds=OUTLIVED_RESTOP_S)
    due = (
        TaskRun.outliving_their_attempt()
        .filter(attempt__ended_at__lt=cutoff)
        .filter(Q(outlived_stop_asked_at__isnull=True) | Q(outlived_stop_asked_at__lt=again))
        .order_by(F("outlived_stop_asked_at").asc(nulls_first=True), "id")  # never asked first
        .values_list("id", "outlived_stop_asked_at")[:100]
    )
    asked = False
    for task_run_id, last_asked in list(due):
        if TaskRun.objects.filter(id=task_run_id, outlived_stop_asked_at=last_asked).update(outlived_stop_asked_at=now):
            later.stop_instance(task_run_id, expires_s=OUTLIVED_RESTOP_S)
            asked = True
    return asked


def stop_stale_preemptions() -> bool:
    """Preempted attempts whose containers still run after a while: the scheduler's worker died
    between claiming the victims and stopping them, and no job of the pool is waiting to do it."""
    from .preemption import RESTOP_AFTER_S, stop_preempted

    cutoff = timezone.now() - timezone.timedelta(seconds=RESTOP_AFTER_S)
    ids = list(
        Attempt.objects.filter(
            state=Attempt.State.RUNNING,
            preempted_at__lt=cutoff,
            task_runs__state__in=[TaskRun.State.CREATED, TaskRun.State.RUNNING],
        )
        .distinct()
        .values_list("id", flat=True)
    )
    if ids:
        stop_preempted(ids, "")
    return bool(ids)


def check_hosts() -> bool:
    """Ping every enabled host at once (liveness.answers); one that is lost (liveness.lost) is
    isolated (a lost connection)."""
    from . import liveness
    from .lifecycle import isolate_host

    hosts = list(DockerHost.objects.filter(enabled=True, isolated=False))
    isolated_any = False
    liveness.keep_pingers_of(hosts)
    answers = liveness.answers(hosts, timeout=HOST_PING_TIMEOUT_S)
    for host in hosts:
        failure = answers[host.id]
        if failure is None:
            liveness.seen(host)
        elif not liveness.lost(host, failure):
            log.warning("host %s did not answer a ping within %s s", host.name, HOST_PING_TIMEOUT_S)
        else:
            cause = failure.__cause__ or failure  # what the connection said (ConnectionError, ReadTimeout)
            isolated_any |= isolate_host(host.id, f"lost connection: {type(cause).__name__}")
    return isolated_any


def _hours_passed(since, hours: int, now) -> bool:
    # settings.HOUR_S, not 3600: a test runs an "hour" in seconds.
    return (now - since).total_seconds() >= hours * settings.HOUR_S


def auto_stop_jobs() -> bool:
    """Stop jobs that ran longer than their auto stop hours (SPEC §3 "auto stop"). The
    clock starts when the job first ran (time queued before does not count) and keeps
    running through restarts."""
    from .stop import auto_stop_reason, request_terminate

    now = timezone.now()
    running = TrainingJob.objects.filter(
        auto_stop_hours__isnull=False,
        started_at__isnull=False,
        terminate_requested=False,
        phase__in=[Phase.RUNNING, Phase.RESTARTING, Phase.PENDING],
    ).values_list("id", "started_at", "auto_stop_hours")
    stopped = False
    for job_id, started_at, hours in running:
        if _hours_passed(started_at, hours, now):
            stopped |= request_terminate(job_id, reason=auto_stop_reason(hours))
    return stopped


def release_retained_jobs() -> bool:
    """Retained jobs whose retention is over, or that the user stopped and whose release
    did not complete: their containers go and the phase becomes Completed / Failed."""
    now = timezone.now()
    asked_before = now - timezone.timedelta(seconds=TERMINATING_GRACE_S)
    ids = [
        job_id
        for job_id, ended_at, hours, asked_at in TrainingJob.objects.filter(phase__in=RETAINED_PHASES).values_list(
            "id", "ended_at", "retention_hours", "terminate_requested_at"
        )
        if (asked_at and asked_at < asked_before) or not (ended_at and hours) or _hours_passed(ended_at, hours, now)
    ]
    for job_id in ids:
        later.stop_job(str(job_id))  # stop_job releases a retained job
    return bool(ids)


OUTPUTS_GRACE_S = 10


def complete_job_outputs() -> bool:
    """Ended jobs whose model is not published or whose logs are not exported yet: the task
    finish() queued was lost, or its worker died (publish and export are idempotent). The
    grace leaves the task finish() queued its turn first."""
    from .outputs import ENDED_PHASES, PUBLISHABLE_PHASES, keeps_logs_q

    cutoff = timezone.now() - timezone.timedelta(seconds=OUTPUTS_GRACE_S)
    to_publish = Q(auto_publish=True, publish_checked_at__isnull=True, phase__in=PUBLISHABLE_PHASES)
    to_export = keeps_logs_q() & Q(logs_exported_at__isnull=True)
    ids = list(
        TrainingJob.objects.filter(phase__in=ENDED_PHASES, ended_at__lt=cutoff)
        .filter(to_publish | to_export)
        .order_by("ended_at")
        .values_list("id", flat=True)[:100]
    )
    for job_id in ids:
        later.job_outputs(str(job_id))
    return bool(ids)


def delete_expired_logs() -> bool:
    """Jobs without keep logs permanently whose retention (LOG_RETENTION_S, 30 days) since
    the end is over: their persisted logs are deleted (SPEC §3 "keep logs permanently")."""
    from .outputs import ENDED_PHASES, drops_logs_q, log_retention_s

    cutoff = timezone.now() - timezone.timedelta(seconds=log_retention_s())
    ids = list(
        TrainingJob.objects.filter(phase__in=ENDED_PHASES, ended_at__lt=cutoff, logs_deleted_at__isnull=True)
        .filter(drops_logs_q())
        .order_by("ended_at")
        .values_list("id", flat=True)[:100]
    )
    for job_id in ids:
        later.delete_job_logs(str(job_id))
    return bool(ids)


# A first try has the message events.record() queued at commit in flight: it gets this long
# before the step queues one more. A retry has no message (the row is its only schedule).
FIRST_TRY_GRACE_S = 5


def resend_notifications() -> bool:
    """Pending notifications due and held by nobody: their message was lost (the broker was down
    at commit, or went down with it; a worker died with it), or they wait for a retry. Queued
    twice, deliver_notification sends once (it claims the row), so this may queue freely."""
    from jobs import tasks
    from jobs.models import Notification

    now = timezone.now()
    first_due = now - timezone.timedelta(seconds=FIRST_TRY_GRACE_S)
    ids = list(
        Notification.objects.filter(status=Notification.Status.PENDING)
        .filter(Q(tries=0, next_try_at__lte=first_due) | Q(tries__gt=0, next_try_at__lte=now))
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .order_by("next_try_at", "id")
        .values_list("id", flat=True)[:100]
    )
    for notification_id in ids:
        try:
            # At once, not after commit as later.py does: there is no transaction here, and a
            # queueing failure must be caught here.
            tasks.deliver_notification.delay(notification_id)
        except Exception:
            log.warning(
                "could not queue notification %s; the next reconcile tries again", notification_id, exc_info=True
            )
            return False  # the broker is down: the others would fail the same way
    return bool(ids)


STEPS = (
    check_hosts,
    schedule_pending_jobs,
    restart_stuck_starts,
    drain_dead_followers,
    end_decided_attempts,
    finish_terminations,
    stop_instances_of_ended_attempts,
    stop_stale_preemptions,
    auto_stop_jobs,
    release_retained_jobs,
    complete_job_outputs,
    delete_expired_logs,
    release_ended_jobs,
    scan_for_orphans_when_due,
    resend_notifications,
)


def reconcile() -> list[str]:
    """Run every step; a step that fails is logged and the others still run (one broken
    row must not stop, say, stuck stops from being finished)."""
    did = []
    for step in STEPS:
        try:
            if step():
                did.append(step.__name__)
        except Exception:
            log.exception("reconcile step %s failed", step.__name__)
    return did
