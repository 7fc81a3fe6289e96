"""What every step of a job's life shares: schedule.py places a job and creates its attempts,
start.py starts them, follow.py and decide.py see them end and decide, stop.py ends the job.

Every step takes ids, re-reads the database and claims its work with a
conditional UPDATE (or a row lock), so it is safe to run twice, concurrently,
or again after a worker died half-way.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from console import realtime
from jobs import events, listing
from jobs.models import Attempt, DockerHost, EventKind, TaskRun, TrainingJob


def announce(job_id) -> None:
    """Tell live pages the job changed, once the change is committed."""
    transaction.on_commit(lambda: realtime.publish(realtime.job_group(job_id), {"type": "job.changed"}))
    transaction.on_commit(lambda: listing.announce_change(job_id))


def lock_job(job_id) -> None:
    """Lock the job's row until the transaction ends: taken before any of its attempts' rows."""
    list(TrainingJob.objects.select_for_update().filter(id=job_id).values_list("id", flat=True))


def active_attempt(job: TrainingJob) -> Attempt | None:
    return job.attempts.filter(state__in=[Attempt.State.STARTING, Attempt.State.RUNNING]).first()


def isolate_host(host_id: int, reason: str, job: TrainingJob | None = None) -> bool:
    """Keep new instances off a faulty host until an operator clears it. The event goes to `job`
    (the one whose failure showed it), or, when no job did (reconcile's ping), to every job with
    an instance on the host: whoever notices first, each affected job's events say why."""
    isolated = DockerHost.objects.filter(id=host_id, isolated=False).update(
        isolated=True, isolation_reason=reason, isolated_at=timezone.now()
    )
    if not isolated and job is None:
        return False
    host = DockerHost.objects.get(id=host_id)
    if not isolated:
        # Isolated already, by reconcile's ping, which told the jobs with a live instance there
        # when it looked: this job's run may have been marked lost just before (a full run
        # caught the job's events silent). Told once per isolation.
        since = {"at__gte": host.isolated_at} if host.isolated_at else {}
        told = job.events.filter(kind=EventKind.HOST_ISOLATED, data__host=host.name, **since).exists()
        if not told:
            events.record(
                job, EventKind.HOST_ISOLATED, f"Host {host.name} isolated: {host.isolation_reason}", host=host.name
            )
        return False
    if job is not None:
        affected = [job]
    else:
        live = TaskRun.objects.filter(host_id=host_id, state__in=[TaskRun.State.CREATED, TaskRun.State.RUNNING])
        affected = list(TrainingJob.objects.filter(attempts__task_runs__in=live).distinct())
    for each in affected:
        events.record(each, EventKind.HOST_ISOLATED, f"Host {host.name} isolated: {reason}", host=host.name)
    return True
