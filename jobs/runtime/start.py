"""Starting an attempt: create and start each instance's container (or restart the command in
place, in the same container), then hand the running instances to the followers."""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from faulttolerance.launcher import DECISION, restart_decision
from faulttolerance.models import RecoveryRecord
from jobs import events
from jobs.models import Attempt, DockerHost, EventKind, Phase, TaskRun, TrainingJob

from . import docker_hosts, engine, followers, later, liveness, standby, stop
from .engine import HOST_ERRORS
from .lifecycle import announce, lock_job
from .logs import docker_time

log = logging.getLogger(__name__)

CREATE_RACE_TRIES = 100  # x 50 ms: a concurrent create of the same container takes well under 5 s


def _create_and_start(job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost]):
    """Create and start the instance's container, or take the one a start of this same
    attempt already made (a retried or concurrent start) or the standby made for it while the
    attempt before ran (standby.py; started already when armed: the take-over's go is the
    restart): one container per task run, and a name already in use (409) is that container,
    not a failed start."""
    for _ in range(CREATE_RACE_TRIES):
        container = engine.container_or_none(task_run.host, task_run.container_name)
        if container is not None and not standby.take_over(job, attempt, task_run, container):
            continue  # a standby that may not be used is gone (take_over removed it): create afresh
        if container is None:
            try:
                container = docker_hosts.create_container(job, attempt, task_run, hosts)
            except engine.EngineError as exc:
                if exc.status_code != 409 or isinstance(exc, engine.Unreachable):
                    raise
                # The name is taken by a create still in flight (Docker reserves the name before
                # the container can be inspected): look again in a moment.
                time.sleep(0.05)
                continue
        if container.status == "created":
            try:
                engine.start_container(container)  # or started by the concurrent start meanwhile
            except engine.NotFound:
                # Removed between the look and the start (a standby no rule should remove now,
                # but a restart must not fail for it): look again, and create it afresh.
                continue
        return container
    raise engine.EngineError(f"container {task_run.container_name} is being created by another start")


def _restart_process(task_run: TaskRun, attempt: Attempt) -> None:
    """Process-level restart: the launcher in the same container runs the command again."""
    container = engine.container(task_run.host, task_run.container_id)
    if container.status != "running":
        raise engine.NotFound(f"container {task_run.container_name} is {container.status}")
    # Only the decision is written here, whole (engine.write_control_file renames it into the
    # container's control dir, which the job cannot write). Ending the old run is the
    # launcher's: it knows which run is the old one. The launcher waiting for it is woken
    # through its FIFO at once (control.wake); the signal below is for one still running the
    # command, or a launcher from before the FIFO.
    engine.write_control_file(attempt.job_id, task_run.container_name, DECISION, restart_decision(attempt.number))
    engine.wake_launcher(attempt.job_id, task_run.container_name)
    # From the engine, not from an exec: no process of ours is in the container when the
    # launcher's kill -1 runs. (PID 1 ignores a signal it has no handler for.) The launcher
    # also polls for the decision: it may have read it, run the new process and ended the
    # container already (a short run); the decision was delivered all the same (a 404 or 409
    # is not an error) and the follower sees the new run's lines and end.
    engine.signal_container(container, "SIGUSR1")


def _terminate_requested(job_id) -> bool:
    return TrainingJob.objects.filter(id=job_id, terminate_requested=True).exists()


def _describe_start_error(attempt: Attempt, task_run: TaskRun, exc: Exception) -> str:
    # The job's row only for a missing image (a create, which has read it): a restart in place of
    # a job deleted meanwhile fails with NotFound, and its description must not need the row.
    if isinstance(exc, engine.ImageNotFound):
        return (
            f"Image '{attempt.job.image}' does not exist on host {task_run.host.name}. "
            "Images are built locally (no registry): ask an operator to load it, or pick a preset image."
        )
    if isinstance(exc, engine.NotFound):
        return f"The container to restart in place is gone: {exc}"
    if isinstance(exc, engine.Unreachable):
        return f"Docker host {task_run.host.name} could not be reached: {exc}"
    explanation = getattr(exc, "explanation", "") or exc
    return f"Docker refused to start the container on host {task_run.host.name}: {explanation}"


def start_attempt(attempt_id: int) -> bool:
    """Create and start (or restart in place) the instances of an attempt; idempotent."""
    # With the job's Stop wish only, not its whole row (some ninety settings, each a column to
    # select and decode): a restart in place needs none of them before its go, the first thing
    # it does; the row is read when a container is made, and for the events after the start.
    attempt = Attempt.objects.annotate(job_terminating=F("job__terminate_requested")).filter(id=attempt_id).first()
    if attempt is None or attempt.state != Attempt.State.STARTING:
        return False
    runs = list(attempt.task_runs.select_related("host").order_by("index"))
    hosts = [r.host for r in runs]
    failed = False
    made = []  # the containers this call created or took: removed here if the job is gone
    marked = []  # the runs this call marked running
    first = True
    for task_run in runs:
        if task_run.state != TaskRun.State.CREATED:
            continue
        # Read with the attempt a moment ago for the first instance; asked again before each
        # one after it (a create takes a while).
        if attempt.job_terminating if first else _terminate_requested(attempt.job_id):
            break
        first = False
        started_at = timezone.now()
        try:
            if task_run.reuses_container:
                # The previous attempt's run of this container is over, whoever follows it. (An
                # earlier attempt of the job has the smaller id: a job's attempts are made one
                # at a time, under its row's lock. No join to the attempts, on the restart's path.)
                TaskRun.objects.filter(
                    container_id=task_run.container_id, state=TaskRun.State.RUNNING, attempt_id__lt=attempt.id
                ).update(state=TaskRun.State.EXITED, ended_at=started_at)
                _restart_process(task_run, attempt)
                container_id = task_run.container_id
            else:
                container = _create_and_start(attempt.job, attempt, task_run, hosts)
                made.append(container)
                container_id = container.id
                # Docker's start; for an armed standby (standby.arm), started while the attempt
                # before ran, now: its launcher ran nothing before the take-over's go, just given.
                docker_started = docker_time(container.attrs["State"].get("StartedAt"))
                started_at = docker_started if docker_started and docker_started >= started_at else timezone.now()
        except HOST_ERRORS as exc:
            # Lost only when the host does not answer any more: a create or start that timed
            # out on a live host (a slow image) is the start's failure, not a faulty host.
            lost = isinstance(exc, engine.Unreachable) and not liveness.still_there(task_run.host)
            TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.CREATED).update(
                state=TaskRun.State.LOST if lost else TaskRun.State.START_FAILED,
                error=_describe_start_error(attempt, task_run, exc),
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
        if TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.CREATED).update(
            state=TaskRun.State.RUNNING, container_id=container_id, started_at=started_at
        ):
            marked.append(task_run.id)
    now = timezone.now()
    with transaction.atomic():
        # The job's row before the attempt's, the order the decision takes (decide.py):
        # a start and a stop's decision racing on one attempt wait for each other, never deadlock.
        lock_job(attempt.job_id)
        moved = Attempt.objects.filter(id=attempt.id, state=Attempt.State.STARTING).update(
            state=Attempt.State.RUNNING, started_at=now
        )
        # The job's whole row, once every instance had its go (read already if a container was
        # made); locked above, so it is there when the attempt is.
        job = attempt.job if moved else None
        if moved and not failed:
            became_running = TrainingJob.objects.filter(
                id=attempt.job_id, phase__in=[Phase.PENDING, Phase.RESTARTING], terminate_requested=False
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
            announce(attempt.job_id)
    if not moved:
        row = Attempt.objects.filter(id=attempt.id).values_list("state", "started_at").first()
        state, ran_since = row or (None, None)
        if state == Attempt.State.ENDED and ran_since is None:
            # Stopped while starting (a stop is the only decision a starting attempt gets): no
            # follower has these runs (a pool adopts a run of an ended attempt only when nobody
            # followed it for a while, followers.adopt), so this start removes the containers
            # (whichever start made them, a dead one's too) and records that those instances
            # ended, now rather than after that while.
            TaskRun.objects.filter(attempt_id=attempt.id, state=TaskRun.State.RUNNING).update(
                state=TaskRun.State.EXITED, ended_at=timezone.now(), error="Stopped while the attempt was starting."
            )
            stop.remove_attempt_containers(attempt.id)
        elif state is not None and _terminate_requested(attempt.job_id):
            _stop_what_this_start_marked(attempt, marked, ended=state == Attempt.State.ENDED)
        # Without a Stop, ended after it ran: a concurrent start of it won (only the winner sets
        # started_at); its followers had the containers, and a container may already be the next
        # attempt's, restarted in place. Nothing here is this call's to undo.
        if state is None:
            # The job was deleted (stopped, then deleted) while this start was in flight: no
            # row is left to find its containers by, and reconcile leaves a container no task
            # run knows alone for ten minutes. Remove them by handle; nothing else can be using
            # them (an ENDED attempt's container may be a later attempt's, restarted in place).
            for container in made:
                try:
                    engine.remove_container(container)
                except HOST_ERRORS as exc:
                    log.info("could not remove %s: %s", container.name, exc)
        # Otherwise (no Stop) a concurrent start of the same attempt won: its containers are in use.
        return False
    for task_run_id in attempt.task_runs.filter(state=TaskRun.State.RUNNING, reuses_container=False).values_list(
        "id", flat=True
    ):
        followers.follow_soon(task_run_id)
    if _terminate_requested(attempt.job_id):
        # The user's Stop came while this start ran. Its stop task may have looked before these
        # instances were running (nothing to stop yet) and come to decide once this start had
        # made the attempt running (a running attempt is not ended while its containers run):
        # nobody would stop them. Ask it again; it is idempotent and decides once they ended.
        later.stop_job(attempt.job_id)
    elif failed:
        later.end_attempt(attempt.id)
    elif standby.wanted(job):  # moved (not moved returned above): the row read under the lock
        later.prepare_standby(attempt.id)
    return True


def _stop_what_this_start_marked(attempt: Attempt, marked: list[int], *, ended: bool) -> None:
    """Another start of this attempt (reconcile queues one after STARTING_GRACE_S) moved it to
    running while this one was still creating, and the user's Stop came meanwhile: the stop
    task may have looked before this start's containers ran. A Stop leaves no next attempt, so
    nothing here is another attempt's. While the attempt runs, the stop task is asked again; once
    it ended, what this start marked running afterwards has no follower yet (a pool adopts a run
    of an ended attempt only after a while, followers.adopt): stopped here, and those runs
    ended, so the orphan scan removes them. A run a follower did take is left to it (it persists
    the last lines, then removes the container)."""
    if not marked:
        return  # the other start's instances: its own end asked the stop task again
    if not ended:
        later.stop_job(attempt.job_id)
        return
    if not TaskRun.objects.filter(id__in=marked, state=TaskRun.State.RUNNING).exists():
        return
    stop.stop_attempt_containers(attempt.id)
    TaskRun.objects.filter(id__in=marked, state=TaskRun.State.RUNNING, follower_token__isnull=True).update(
        state=TaskRun.State.EXITED, ended_at=timezone.now(), error="Stopped while the attempt was starting."
    )
