"""Following a running instance: its log persisted, hangs watched, and how it ended.

A follower per container (a thread of the worker's follower pool, followers.py) persists
its log, watches it for hangs, and records how it ended: the user's process exited (the
launcher's report; the container waits for a decision), the container ended, or its host
went away. Then decide.py decides the attempt's end, exactly once.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs import events
from jobs.models import Attempt, EventKind, TaskRun

from . import dbpool, docker_hosts, engine, liveness, reports, resources
from .decide import attempt_may_have_ended
from .engine import HOST_ERRORS
from .hang import HangWatch, Sampler, capture_stacks, no_gpu, nvidia_smi_gpu
from .logs import Follower, ProcessExited, docker_time
from .stop import containers_kept

log = logging.getLogger(__name__)

SUCCESSOR_WAIT_S = 10
# Reads of an ended container's rest of the log that fail (each bounded: engine.LOG_REST_TIMEOUT_S)
# before the run is marked exited with what was taken: its end is the engine's, known already.
REST_OF_LOG_TRIES = 3
# The follower's own calls to the engine (the look-up, the look after the stream's end, the clear-up)
# each wait at most this long. Not the followed log's body: engine.log_stream turns that socket's
# timeout off (a quiet job is not a broken stream).
FOLLOWER_CALL_TIMEOUT_S = 30


def follow_task_run(task_run_id: int, *, drain: bool = False) -> bool:
    """Persist a container's log until it ends, then record how it ended. drain: the run
    ended while its follower was dead: persist what is left of its log, then clear up."""
    follower = Follower(task_run_id, waiting_exit=None if drain else _waiting_exit)
    task_run = follower.claim(ended=drain)
    if task_run is None:
        return False
    watch = _hang_watch(task_run)
    sampler: Sampler | None = None
    recorder: resources.ResourceRecorder | None = None
    container = None
    drained = False
    ended_container = None  # the handle the engine said it ended with (its state is final)
    rest_failures = 0

    def on_tick(current: TaskRun, got_lines: bool) -> None:
        if watch.tick(None, got_lines):
            with follower.beating():  # its stacks taken, its hang restart decided and started
                hang_suspected(current.id, container, watch.metrics())
        dbpool.release_connection_if_pooled()

    try:
        while True:
            try:
                # Inside the try: a new client asks the engine for its API version. The drain
                # reads an ended container's log once more: the handle it ended with will do.
                if container is None or not drained:
                    ref = task_run.container_id or task_run.container_name
                    container = engine.container(task_run.host, ref, timeout=FOLLOWER_CALL_TIMEOUT_S)
                if sampler is None:
                    recorder = _resource_recorder(task_run, container)
                    sampler = Sampler(watch, container, recorder, engine=task_run.host.base_url, host=task_run.host)
                    sampler.start()
                follower.follow(task_run, container, on_tick, ended=drained)
                if follower.lost_ownership:
                    return False
                if not drained:  # an ended container's state is final: read once
                    engine.refresh(container)
            except ProcessExited as exit_:
                with follower.beating():  # the decision and the restart's start are made here
                    successor = process_exited(task_run, exit_.code, exit_.oom_killed)
                if successor is not None:
                    handed_over = follower.handover(successor.id)
                    if handed_over is None:
                        return False  # another follower has the next run (and this container)
                    task_run = handed_over
                    watch.reset()
                    if recorder is not None:
                        recorder.switch(task_run)  # the next run's chart, in this same container
                continue  # keep reading: the next run's lines, or the container's end
            except engine.NotFound:
                _mark_lost(task_run, "The container vanished (removed outside the console).")
                break
            except HOST_ERRORS as exc:
                follower.close_stream()
                engine.forget_client(task_run.host)
                if drained:
                    rest_failures += 1
                    if rest_failures >= REST_OF_LOG_TRIES:
                        log.warning("the rest of %s's log could not be read: %s", task_run.container_name, exc)
                        _mark_exited(task_run, ended_container)
                        break
                if liveness.still_there(task_run.host):  # answered, or slow but not lost yet
                    if not follower.owns():
                        # Another follower took the run while this one waited for the engine (an
                        # engine that answers pings and not for this container): that one goes on.
                        return False
                    task_run.refresh_from_db()
                    container = None  # its client was forgotten: look the container up again
                    continue  # a broken stream on a live host: follow again from the last line
                _mark_lost(task_run, f"Docker host {task_run.host.name} became unreachable: {exc}")
                break
            if container.status in ("running", "restarting", "paused"):
                task_run.refresh_from_db()
                continue  # the stream ended early; the container is still alive
            if not drained:
                # Docker's follow stream can end before the entry written at the container's
                # exit (output without a final newline): read once more from the last line taken
                # (follow() takes where the log stands from the database).
                drained, ended_container = True, container
                continue
            _mark_exited(task_run, container)
            break
    finally:
        if sampler is not None:
            sampler.stop()
        if recorder is not None:
            recorder.close()
        follower.close_stream()
        follower.release()
    # Decide (and start the next attempt) first; clearing up can wait.
    attempt_may_have_ended(task_run.attempt_id)
    if container is not None and not containers_kept(task_run.attempt.job_id):  # retention keeps it
        try:
            engine.clear_away(container)
            if task_run.attempt.job.node_count > 1:
                docker_hosts.remove_past_networks(task_run.attempt.job, task_run.host)
        except HOST_ERRORS:
            log.warning("could not remove %s or its attempt's network", task_run.container_name)
    return True


def _waiting_exit(task_run: TaskRun) -> ProcessExited | None:
    """The launcher's report (never the log) that this run's process ended non-zero and its
    container waits for the supervisor's decision (a fault-tolerant job's process restart)."""
    if task_run.attempt.job.max_restarts_effective <= 0:
        return None  # the launcher does not wait: the container ends, and the engine says how
    report = reports.exit_report_of(task_run)
    if report is None or report.code == 0:
        return None
    return ProcessExited(report.code, report.oom_killed)


def _resource_recorder(task_run: TaskRun, container) -> resources.ResourceRecorder | None:
    """The instance's resource chart; a chart that cannot be opened is no reason to stop following."""
    try:
        return resources.ResourceRecorder(task_run, container)
    except Exception:
        log.exception("no resource chart for %s", task_run.container_name)
        return None


def _hang_watch(task_run: TaskRun) -> HangWatch:
    job = task_run.attempt.job
    gpus = job.flavor_id is not None and job.flavor.gpus > 0
    # Sampled by its Sampler only (on the SamplingPool): the follower's ticks (no container at
    # hand) only judge.
    return HangWatch(
        window_s=job.hang_window_s or settings.HANG_WINDOW_S,
        gpu_sampler=nvidia_smi_gpu if gpus else no_gpu,
        sample_inline=False,
    )


def _mark_exited(task_run: TaskRun, container) -> None:
    """The container ended: its exit code and OOM flag from the engine; a child the kernel
    killed for memory (PID 1 lived on) from the launcher's report."""
    state = container.attrs["State"]
    report = reports.exit_report_of(task_run)
    TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.RUNNING).update(
        state=TaskRun.State.EXITED,
        exit_code=state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")) or bool(report and report.oom_killed),
        ended_at=docker_time(state.get("FinishedAt")) or timezone.now(),
    )


def _mark_lost(task_run: TaskRun, reason: str) -> None:
    TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.RUNNING).update(
        state=TaskRun.State.LOST, error=reason, ended_at=timezone.now()
    )


def process_exited(task_run: TaskRun, code: int, oom_killed: bool = False) -> TaskRun | None:
    """The user's process ended in a live container: decide, and return the task
    run that restarts in this same container (process level), if any."""
    TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.RUNNING).update(
        state=TaskRun.State.EXITED, exit_code=code, oom_killed=oom_killed, ended_at=timezone.now(), ended_in_place=True
    )
    attempt_may_have_ended(task_run.attempt_id)
    deadline = time.monotonic() + SUCCESSOR_WAIT_S
    while time.monotonic() < deadline:
        successor = (
            TaskRun.later_in_its_container(task_run.container_id, task_run.attempt.job_id, task_run.attempt.number)
            .order_by("attempt__number")
            .first()
        )
        if successor is not None:
            return successor
        attempt = Attempt.objects.get(id=task_run.attempt_id)
        if attempt.state == Attempt.State.ENDED and attempt.outcome:
            return None  # decided, and not a restart in this container
        time.sleep(0.05)
    return None


def hang_suspected(task_run_id: int, container, metrics: dict) -> None:
    """Suspected hang: an event (and notification) always; with H, a hang restart."""
    if not TaskRun.objects.filter(id=task_run_id, state=TaskRun.State.RUNNING, hang_suspected_at=None).update(
        hang_suspected_at=timezone.now(), evidence={"hang": metrics}
    ):
        return
    task_run = TaskRun.objects.select_related("attempt__job").get(id=task_run_id)
    job = task_run.attempt.job
    with transaction.atomic():
        events.record(
            job,
            EventKind.SUSPECTED_HANG,
            (
                f"worker-{task_run.index} looks stuck: no CPU use, no log output, no GPU use "
                f"for {metrics['idle_for_s']} s (window {metrics['window_s']} s)."
            )
            if metrics.get("gpu_util_percent") is not None
            else (
                f"worker-{task_run.index} looks stuck: no CPU use, no log output "
                f"for {metrics['idle_for_s']} s (window {metrics['window_s']} s)."
            ),
            task=task_run.task_name,
            **metrics,
        )
    if not (job.hang_restart and job.max_restarts_effective > 0):
        return
    stacks = capture_stacks(container)
    TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.RUNNING).update(
        state=TaskRun.State.EXITED,
        hung=True,
        ended_in_place=True,
        ended_at=timezone.now(),
        evidence={"hang": metrics, "stacks": stacks},
    )
    attempt_may_have_ended(task_run.attempt_id)
