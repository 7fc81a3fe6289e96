"""Moving a job through its phases: submit, schedule, start, stop.

Every step takes ids, re-reads the database and claims its work with a
conditional UPDATE (or a row lock), so it is safe to run twice, concurrently,
or again after a worker died half-way. What happens when an instance ends is
in follow.py and decide.py.
"""

from __future__ import annotations

import logging
import time

import docker
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from console import realtime
from faulttolerance.classify import PREEMPTED
from faulttolerance.launcher import DECISION, restart_decision
from faulttolerance.models import RecoveryRecord
from jobs import events, listing
from jobs.models import FINAL_PHASES, RETAINED_PHASES, Attempt, DockerHost, EventKind, Phase, TaskRun, TrainingJob

from . import docker_hosts, engine, followers, placement, preemption
from .engine import HOST_ERRORS
from .logs import docker_time

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5
CREATE_RACE_TRIES = 100  # x 50 ms: a concurrent create of the same container takes well under 5 s


def announce(job_id) -> None:
    """Tell live pages the job changed, once the change is committed."""
    transaction.on_commit(lambda: realtime.publish(realtime.job_group(job_id), {"type": "job.changed"}))
    transaction.on_commit(lambda: listing.announce_change(job_id))


def dispatch(task_name: str, *args) -> None:
    """Queue a Celery task after the current transaction commits."""
    from jobs import tasks  # tasks imports this module

    task = getattr(tasks, task_name)
    transaction.on_commit(lambda: task.delay(*args))


# -- submitting and scheduling ---------------------------------------------------
def submit(job: TrainingJob) -> None:
    """Queue a freshly created job; call inside the creating transaction."""
    TrainingJob.objects.filter(id=job.id, phase=Phase.CREATING).update(phase=Phase.PENDING)
    announce(job.id)
    dispatch("schedule_job", str(job.id))


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
            name = f"tj-{job.id.hex}-a{number}-w{index}"
            runs.append(TaskRun(attempt=attempt, index=index, host=host, container_name=name))
    TaskRun.objects.bulk_create(runs)
    transaction.on_commit(lambda: _start_now(attempt.id))
    return attempt


def _start_now(attempt_id: int) -> None:
    """Start the attempt in this thread right after commit: a restart is not
    queued behind a Celery round trip. Should this thread die, reconcile's
    restart_stuck_starts finds the attempt still starting and queues it."""
    try:
        start_attempt(attempt_id)
    except Exception:
        log.exception("starting attempt %s failed; reconcile will retry", attempt_id)


def lock_job(job_id) -> None:
    """Lock the job's row until the transaction ends: taken before any of its attempts' rows."""
    list(TrainingJob.objects.select_for_update().filter(id=job_id).values_list("id", flat=True))


def active_attempt(job: TrainingJob) -> Attempt | None:
    return job.attempts.filter(state__in=[Attempt.State.STARTING, Attempt.State.RUNNING]).first()


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
            finish(job, Phase.TERMINATED, "Terminated before it started.")
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
        dispatch("schedule_job", str(head))


# -- starting ------------------------------------------------------------------
def _create_and_start(job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost]):
    """Create and start the instance's container, or take the one a start of this same
    attempt already made (a retried or concurrent start): one container per task run,
    and a name already in use (409) is that container, not a failed start."""
    client = docker_hosts.client_for(task_run.host)
    container = None
    for _ in range(CREATE_RACE_TRIES):
        try:
            container = client.containers.get(task_run.container_name)
            break
        except docker.errors.NotFound:
            pass
        try:
            container = docker_hosts.create_container(client, job, attempt, task_run, hosts)
            break
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
            # The name is taken by a create still in flight (Docker reserves the name before
            # the container can be inspected): look again in a moment.
            time.sleep(0.05)
    if container is None:
        raise docker.errors.APIError(f"container {task_run.container_name} is being created by another start")
    if container.status == "created":
        try:
            container.start()
        except docker.errors.APIError as exc:
            if exc.status_code not in (304, 409):  # started by the concurrent start meanwhile
                raise
        container.reload()
    return container


def _restart_process(task_run: TaskRun, attempt: Attempt) -> None:
    """Process-level restart: the launcher in the same container runs the command again."""
    container = docker_hosts.client_for(task_run.host).containers.get(task_run.container_id)
    if container.status != "running":
        raise docker.errors.NotFound(f"container {task_run.container_name} is {container.status}")
    # Only the decision is written here, whole (engine.write_control_file renames it into the
    # container's control dir, which the job cannot write). Ending the old run is the
    # launcher's: it knows which run is the old one.
    engine.write_control_file(attempt.job_id, task_run.container_name, DECISION, restart_decision(attempt.number))
    # From the engine, not from an exec: no process of ours is in the container when the
    # launcher's kill -1 runs. (PID 1 ignores a signal it has no handler for.)
    try:
        container.kill(signal="SIGUSR1")
    except docker.errors.APIError as exc:
        # The launcher also polls for the decision: it may have read it, run the new process
        # and ended the container already (a short run). The decision was delivered all the
        # same; the follower sees the new run's lines and end.
        if exc.status_code not in (404, 409):
            raise


def _host_answers(host: DockerHost) -> bool:
    try:
        docker_hosts.client_for(host, timeout=5).ping()
        return True
    except HOST_ERRORS:
        return False


def _describe_start_error(job: TrainingJob, task_run: TaskRun, exc: Exception) -> str:
    if isinstance(exc, docker.errors.ImageNotFound):
        return (
            f"Image '{job.image}' does not exist on host {task_run.host.name}. "
            "Images are built locally (no registry): ask an operator to load it, or pick a preset image."
        )
    if isinstance(exc, docker.errors.NotFound):
        return f"The container to restart in place is gone: {exc}"
    if isinstance(exc, docker.errors.APIError):
        return f"Docker refused to start the container on host {task_run.host.name}: {exc.explanation or exc}"
    return f"Docker host {task_run.host.name} could not be reached: {exc}"


def start_attempt(attempt_id: int) -> bool:
    """Create and start (or restart in place) the instances of an attempt; idempotent."""
    attempt = Attempt.objects.select_related("job").filter(id=attempt_id).first()
    if attempt is None or attempt.state != Attempt.State.STARTING:
        return False
    job = attempt.job
    runs = list(attempt.task_runs.select_related("host").order_by("index"))
    hosts = [r.host for r in runs]
    failed = False
    for task_run in runs:
        if task_run.state != TaskRun.State.CREATED:
            continue
        if TrainingJob.objects.filter(id=job.id, terminate_requested=True).exists():
            break
        started_at = timezone.now()
        try:
            if task_run.reuses_container:
                # The previous attempt's run of this container is over, whoever follows it.
                TaskRun.objects.filter(
                    container_id=task_run.container_id, state=TaskRun.State.RUNNING, attempt__number__lt=attempt.number
                ).update(state=TaskRun.State.EXITED, ended_at=started_at)
                _restart_process(task_run, attempt)
                container_id = task_run.container_id
            else:
                container = _create_and_start(job, attempt, task_run, hosts)
                container_id = container.id
                started_at = docker_time(container.attrs["State"].get("StartedAt")) or started_at
        except HOST_ERRORS as exc:
            # Lost only when the host does not answer any more: a create or start that timed
            # out on a live host (a slow image) is the start's failure, not a faulty host.
            lost = not isinstance(exc, docker.errors.APIError) and not _host_answers(task_run.host)
            TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.CREATED).update(
                state=TaskRun.State.LOST if lost else TaskRun.State.START_FAILED,
                error=_describe_start_error(job, task_run, exc),
                ended_at=timezone.now(),
            )
            failed = True
            continue
        except Exception as exc:
            # Anything else (the console's own setup: its tools, the control dir) fails this
            # start with the reason rather than leaving the attempt starting forever.
            log.exception("starting %s failed", task_run.container_name)
            TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.CREATED).update(
                state=TaskRun.State.START_FAILED,
                error=f"The console could not start the container: {type(exc).__name__}: {str(exc)[:300]}",
                ended_at=timezone.now(),
            )
            failed = True
            continue
        TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.CREATED).update(
            state=TaskRun.State.RUNNING, container_id=container_id, started_at=started_at
        )
    now = timezone.now()
    with transaction.atomic():
        # The job's row before the attempt's, the order the decision takes (decide.py):
        # a start and a stop's decision racing on one attempt wait for each other, never deadlock.
        lock_job(job.id)
        moved = Attempt.objects.filter(id=attempt.id, state=Attempt.State.STARTING).update(
            state=Attempt.State.RUNNING, started_at=now
        )
        if moved and not failed:
            became_running = TrainingJob.objects.filter(
                id=job.id, phase__in=[Phase.PENDING, Phase.RESTARTING], terminate_requested=False
            ).update(phase=Phase.RUNNING, phase_reason="", started_at=Coalesce(F("started_at"), now))
            RecoveryRecord.objects.filter(next_attempt=attempt, running_again_at=None).update(running_again_at=now)
            if became_running:
                if attempt.number == 1:
                    events.record(job, EventKind.STARTED, f"Started on {', '.join(sorted({h.name for h in hosts}))}.")
                else:
                    events.record(
                        job,
                        EventKind.RESTARTED,
                        f"Attempt {attempt.number} running ({attempt.level} level).",
                        level=attempt.level,
                        attempt=attempt.number,
                    )
            announce(job.id)
    if not moved:
        if Attempt.objects.filter(id=attempt.id, state=Attempt.State.ENDED).exists():
            # Stopped while we were starting: nobody else will remove what we
            # made, nor record that those instances ended.
            TaskRun.objects.filter(attempt_id=attempt.id, state=TaskRun.State.RUNNING).update(
                state=TaskRun.State.EXITED, ended_at=timezone.now(), error="Stopped while the attempt was starting."
            )
            remove_attempt_containers(attempt.id)
        # Otherwise a concurrent start of the same attempt won: its containers are in use.
        return False
    for task_run_id in attempt.task_runs.filter(state=TaskRun.State.RUNNING, reuses_container=False).values_list(
        "id", flat=True
    ):
        followers.follow_soon(task_run_id)
    if failed or TrainingJob.objects.filter(id=job.id, terminate_requested=True).exists():
        _dispatch_now("end_attempt", attempt.id)
    return True


def _dispatch_now(task_name: str, *args) -> None:
    from jobs import tasks

    getattr(tasks, task_name).delay(*args)


PHASE_EVENTS = {
    Phase.COMPLETED: EventKind.COMPLETED,
    Phase.FAILED: EventKind.FAILED,
    Phase.TERMINATED: EventKind.TERMINATED,
}
RETAINED = {Phase.COMPLETED: Phase.COMPLETED_RETAINED, Phase.FAILED: Phase.FAILED_RETAINED}
RELEASED = {retained: ended for ended, retained in RETAINED.items()}


def finish(job: TrainingJob, phase: str, reason: str) -> None:
    """End the job; with retention a Completed or Failed job keeps its containers (SPEC §3)."""
    message = reason or f"The job {phase.lower()}."
    if phase in RETAINED and keeps_containers(job):
        note = retention_note(job.retention_hours)
        phase, reason, message = RETAINED[phase], f"{reason} {note}".strip(), f"{message} {note}"
    elif keeps_containers(job):
        # Terminated: nothing is kept, including what an instance that ended earlier left.
        attempt_ids = list(job.attempts.values_list("id", flat=True))
        transaction.on_commit(lambda: [remove_attempt_containers(a) for a in attempt_ids])
    TrainingJob.objects.filter(id=job.id).update(phase=phase, phase_reason=reason, ended_at=timezone.now())
    events.record(job, PHASE_EVENTS[RELEASED.get(phase, phase)], message)
    announce(job.id)
    transaction.on_commit(lambda: kick_queue(job))
    dispatch("job_outputs", str(job.id))  # auto-publish and log export, once (outputs.py)


# -- auto stop and retention (SPEC §3 "more settings") -------------------------------
AUTO_STOP_REASON = "Auto stopped after {hours} hour{s} of running."
STOPPED_BY_USER = "Stopped by the user."


def hours_text(hours: int) -> str:
    return f"{hours} hour{'s' if hours != 1 else ''}"


def auto_stop_reason(hours: int) -> str:
    return AUTO_STOP_REASON.format(hours=hours, s="s" if hours != 1 else "")


def stop_reason(job: TrainingJob) -> str:
    """Why a stopped job ended: auto stop wrote its reason when it asked; otherwise the user stopped it."""
    if job.phase_reason.startswith("Auto stopped after "):
        return job.phase_reason
    return STOPPED_BY_USER


def keeps_containers(job: TrainingJob) -> bool:
    """Retention applies: dedicated pools only, never with fault tolerance (the form refuses both)."""
    return bool(job.retention_hours) and job.dedicated and not job.fault_tolerance


def retention_note(hours: int) -> str:
    return f"Containers kept for {hours_text(hours)} (retention)."


def containers_kept(job_id) -> bool:
    """Whether an ended container of the job stays: the job is retained, or it may still be
    (its other instances run on). A stopped job keeps nothing."""
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or not keeps_containers(job):
        return False
    return job.phase in RETAINED_PHASES or not (job.is_final or job.terminate_requested)


def release_retained(job_id) -> bool:
    """Remove a retained job's containers and move it to Completed / Failed: its retention
    is over, or the user stopped it. Idempotent."""
    job = TrainingJob.objects.filter(id=job_id, phase__in=RETAINED_PHASES).first()
    if job is None:
        return False
    for attempt_id in job.attempts.values_list("id", flat=True):
        remove_attempt_containers(attempt_id)
    why = "when the user stopped the job" if job.terminate_requested else f"after {hours_text(job.retention_hours)}"
    reason = job.phase_reason.removesuffix(retention_note(job.retention_hours)).strip()
    with transaction.atomic():
        released = TrainingJob.objects.filter(id=job.id, phase=job.phase).update(
            phase=RELEASED[job.phase], phase_reason=f"{reason} Containers removed {why}.".strip()
        )
        if released:
            announce(job.id)
    return bool(released)


# -- hosts -------------------------------------------------------------------------
def isolate_host(host_id: int, reason: str, job: TrainingJob | None = None) -> bool:
    """Keep new instances off a faulty host until an operator clears it."""
    isolated = DockerHost.objects.filter(id=host_id, isolated=False).update(
        isolated=True, isolation_reason=reason, isolated_at=timezone.now()
    )
    if isolated and job is not None:
        host = DockerHost.objects.get(id=host_id)
        events.record(job, EventKind.HOST_ISOLATED, f"Host {host.name} isolated: {reason}", host=host.name)
    return bool(isolated)


# -- stopping ----------------------------------------------------------------------
def request_terminate(job_id, reason: str = "") -> bool:
    """The user's Stop (or auto stop, with its reason): record the wish; the worker converges.
    Stopping a retained job releases its containers now."""
    now = timezone.now()
    with transaction.atomic():
        wish = TrainingJob.objects.filter(id=job_id, terminate_requested=False)
        changed = wish.filter(phase__in=RETAINED_PHASES).update(terminate_requested=True, terminate_requested_at=now)
        if not changed:
            changed = wish.exclude(phase__in=FINAL_PHASES | RETAINED_PHASES).update(
                terminate_requested=True,
                terminate_requested_at=now,
                phase=Phase.TERMINATING,
                **({"phase_reason": reason} if reason else {}),
            )
        if changed:
            announce(job_id)
            dispatch("stop_job", str(job_id))
    return bool(changed)


def _containers_of(attempt_id: int):
    for task_run in TaskRun.objects.filter(attempt_id=attempt_id).select_related("host"):
        try:
            yield task_run, docker_hosts.client_for(task_run.host).containers.get(task_run.container_name)
        except docker.errors.NotFound:
            continue
        except HOST_ERRORS as exc:
            log.warning("cannot reach %s for %s: %s", task_run.host.name, task_run.container_name, exc)


def stop_attempt_containers(attempt_id: int) -> None:
    """docker stop every container of an attempt (the launcher forwards SIGTERM)."""
    for task_run, container in _containers_of(attempt_id):
        try:
            container.stop(timeout=STOP_TIMEOUT_S)
        except HOST_ERRORS as exc:
            log.warning("could not stop %s: %s", task_run.container_name, exc)


def remove_attempt_containers(attempt_id: int) -> None:
    for task_run, container in _containers_of(attempt_id):
        try:
            container.remove(force=True)
        except HOST_ERRORS as exc:
            log.warning("could not remove %s: %s", task_run.container_name, exc)


def stop_job(job_id) -> bool:
    """Stop every container of a job whose termination was requested; for a retained job
    (its retention is over, or the user stopped it) remove its containers."""
    from .decide import attempt_may_have_ended

    job = TrainingJob.objects.filter(id=job_id).first()
    if job is not None and job.phase in RETAINED_PHASES:
        return release_retained(job.id)
    if job is None or not job.terminate_requested or job.is_final:
        return False
    attempt = active_attempt(job)
    if attempt is None:
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().get(id=job_id)
            if not job.is_final and active_attempt(job) is None:
                finish(job, Phase.TERMINATED, stop_reason(job))
        return True
    if attempt.state == Attempt.State.RUNNING or attempt.task_runs.exclude(state=TaskRun.State.CREATED).exists():
        stop_attempt_containers(attempt.id)
    # Followers record the exits; this covers attempts with nothing left to follow.
    attempt_may_have_ended(attempt.id)
    return True
