"""Scheduling: a submitted job waits in its queue until hosts are placed for it, then gets an
attempt (the first, or the next one a recovery asked for), started right after commit."""

from __future__ import annotations

import logging

from django.db import transaction

from faulttolerance.classify import PREEMPTED
from faulttolerance.models import RecoveryRecord
from jobs.models import Attempt, DockerHost, Phase, TaskRun, TrainingJob

from . import docker_hosts, later, placement, preemption, start, stop
from .lifecycle import active_attempt, announce

log = logging.getLogger(__name__)


def submit(job: TrainingJob) -> None:
    """Queue a freshly created job; call inside the creating transaction."""
    TrainingJob.objects.filter(id=job.id, phase=Phase.CREATING).update(phase=Phase.PENDING)
    announce(job.id)
    later.schedule_job(job.id)


def pick_hosts(
    job: TrainingJob, count: int, *, for_recovery: bool = False, avoid: set[int] = frozenset()
) -> list[DockerHost] | None:
    """Hosts for `count` instances of a job that is running elsewhere (instance rescheduling):
    its pool, capacity and affinity; its other instances keep their share of the hosts."""
    return placement.place_job(job, count, for_recovery=for_recovery, avoid=avoid, replacing=False).hosts


def new_attempt(job: TrainingJob, hosts: list[DockerHost], level: str, reuse: dict[int, TaskRun] | None = None):
    """Create the next attempt; `reuse` maps instance index -> task run whose container restarts in place."""
    reuse = reuse or {}
    number = (job.attempts.order_by("-number").values_list("number", flat=True).first() or 0) + 1
    attempt = Attempt.objects.create(job=job, number=number, level=level)
    runs = []
    for index, host in enumerate(hosts):
        previous = reuse.get(index)
        if previous is not None:
            runs.append(
                TaskRun(
                    attempt=attempt,
                    index=index,
                    host=previous.host,
                    container_name=previous.container_name,
                    container_id=previous.container_id,
                    reuses_container=True,
                )
            )
        else:
            name = docker_hosts.container_name(job, number, index)
            runs.append(TaskRun(attempt=attempt, index=index, host=host, container_name=name))
    TaskRun.objects.bulk_create(runs)
    transaction.on_commit(lambda: _start_now(attempt.id))
    return attempt


def _start_now(attempt_id: int) -> None:
    """Start the attempt in this thread right after commit: a restart is not
    queued behind a Celery round trip. Should this thread die, reconcile's
    restart_stuck_starts finds the attempt still starting and queues it."""
    try:
        start.start_attempt(attempt_id)
    except Exception:
        log.exception("starting attempt %s failed; reconcile will retry", attempt_id)


def schedule_job(job_id) -> bool:
    """Schedule the queue the job waits in (its dedicated pool, or the public pools).

    The queue goes by priority (3 first), then age; a job that waits for capacity
    holds back the jobs behind it, so a large high-priority job is not starved by
    small ones slipping past (strict order, no backfill). A job that cannot be
    placed for another reason (no healthy host, its affinity hosts are down) does
    not hold the queue. On a dedicated pool the first job that waits for capacity
    may preempt lower-priority preemptible jobs (preemption.py). Returns whether a
    job was placed or ended.
    """
    job = TrainingJob.objects.filter(id=job_id).only("pool_type", "pool_id").first()
    if job is None:
        return False
    did_work = False
    blocked_by: TrainingJob | None = None
    for queued_id in queue(job).values_list("id", flat=True):
        outcome, queued = _schedule_one(queued_id, blocked_by)
        did_work |= outcome == PLACED
        if outcome == WAITING_FOR_CAPACITY and blocked_by is None:
            blocked_by = queued
    return did_work


def queue(job: TrainingJob):
    """The Pending jobs that compete for the same hosts as `job`, first to be placed first."""
    jobs = TrainingJob.objects.filter(phase=Phase.PENDING, pool_type=job.pool_type)
    if job.dedicated:
        jobs = jobs.filter(pool_id=job.pool_id)
    return jobs.order_by("-priority", "created_at", "id")


PLACED, WAITING, WAITING_FOR_CAPACITY, SKIPPED = "placed", "waiting", "waiting for capacity", "skipped"


def _schedule_one(job_id, blocked_by: TrainingJob | None) -> tuple[str, TrainingJob | None]:
    """Place one Pending job's instances and create its next attempt, unless a job ahead of it waits."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(id=job_id).first()
        if job is None or job.phase != Phase.PENDING or active_attempt(job):
            return SKIPPED, job
        if job.terminate_requested:
            stop.finish(job, Phase.TERMINATED, "Terminated before it started.")
            return PLACED, job
        if blocked_by is not None:
            _set_reason(
                job, f"Queued behind {blocked_by.name} (priority {blocked_by.priority}), which waits for capacity."
            )
            return WAITING, job
        waiting_recovery = RecoveryRecord.objects.filter(job=job, restart=True, next_attempt=None).first()
        # Hot-standby hosts take over failed work; a preempted job waits like any other.
        for_recovery = waiting_recovery is not None and waiting_recovery.failure_class != PREEMPTED
        placed = placement.place_job(job, for_recovery=for_recovery)
        if placed.hosts is None:
            if not placed.waiting_for_capacity:
                _set_reason(job, placed.reason)
                return WAITING, job
            # Still under the placement lock: no other scheduler preempts for the same room.
            making_room = preemption.preempt_for(job, for_recovery=for_recovery)
            _set_reason(job, f"{placed.reason} {making_room}".strip())
            return WAITING_FOR_CAPACITY, job
        level = waiting_recovery.level if waiting_recovery else "initial"
        attempt = new_attempt(job, placed.hosts, level)
        # Beside preemption's "preempting x for y": the order in which jobs took the room.
        log.info(
            "placed %s (priority %s) on %s: attempt %s",
            job.name,
            job.priority,
            ", ".join(h.name for h in placed.hosts),
            attempt.number,
        )
        if waiting_recovery:
            RecoveryRecord.objects.filter(id=waiting_recovery.id).update(next_attempt=attempt)
        return PLACED, job


def _set_reason(job: TrainingJob, reason: str) -> None:
    """The Pending reason says why the job waits (SPEC §6 "Pending (queued)")."""
    if job.phase_reason != reason:
        TrainingJob.objects.filter(id=job.id).update(phase_reason=reason)
        announce(job.id)


def kick_queue(job: TrainingJob) -> None:
    """Capacity was freed: schedule the job's queue now, not at the next reconcile."""
    head = queue(job).exclude(id=job.id).values_list("id", flat=True).first()
    if head is not None:
        later.schedule_job(head)
