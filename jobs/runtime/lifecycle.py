"""Moving a job through its phases: schedule, start, follow, end, decide, stop.

Every step takes ids, re-reads the database and claims its work with a
conditional UPDATE (or a row lock for the restart decision), so it is safe to
run twice, concurrently, or again after a worker died half-way.
"""

from __future__ import annotations

import logging

import docker
import requests
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from console import realtime
from faulttolerance import classify as c
from faulttolerance.models import RecoveryRecord
from faulttolerance.policy import Counters, Policy, decide
from jobs.models import FINAL_PHASES, Attempt, DockerHost, Phase, TaskRun, TrainingJob

from . import docker_hosts
from .logs import Follower, docker_time, recent_text

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5
STABLE_WINDOW_S = 600
HOST_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def announce(job_id) -> None:
    """Tell live pages the job changed, once the change is committed."""
    transaction.on_commit(lambda: realtime.publish(realtime.job_group(job_id), {"type": "job.changed"}))


def _dispatch(task_name: str, *args) -> None:
    from jobs import tasks  # tasks imports this module

    task = getattr(tasks, task_name)
    transaction.on_commit(lambda: task.delay(*args))


# -- submitting and scheduling ---------------------------------------------------
def submit(job: TrainingJob) -> None:
    """Queue a freshly created job; call inside the creating transaction."""
    TrainingJob.objects.filter(id=job.id, phase=Phase.CREATING).update(phase=Phase.PENDING)
    announce(job.id)
    _dispatch("schedule_job", str(job.id))


def pick_hosts(count: int) -> list[DockerHost] | None:
    """Least-loaded healthy hosts, one per instance, spreading round robin."""
    hosts = list(DockerHost.objects.filter(enabled=True, isolated=False).order_by("id"))
    if not hosts:
        return None
    load = {
        h.id: TaskRun.objects.filter(host=h, state__in=[TaskRun.State.CREATED, TaskRun.State.RUNNING]).count()
        for h in hosts
    }
    chosen = []
    for _ in range(count):
        host = min(hosts, key=lambda h: load[h.id])
        load[host.id] += 1
        chosen.append(host)
    return chosen


def _new_attempt(job: TrainingJob, hosts: list[DockerHost], level: str) -> Attempt:
    number = (job.attempts.order_by("-number").values_list("number", flat=True).first() or 0) + 1
    attempt = Attempt.objects.create(job=job, number=number, level=level)
    TaskRun.objects.bulk_create(
        TaskRun(attempt=attempt, index=i, host=host, container_name=f"tj-{job.id.hex}-a{number}-w{i}")
        for i, host in enumerate(hosts)
    )
    _dispatch("start_attempt", attempt.id)
    return attempt


def _active_attempt(job: TrainingJob) -> Attempt | None:
    return job.attempts.filter(state__in=[Attempt.State.STARTING, Attempt.State.RUNNING]).first()


def schedule_job(job_id) -> bool:
    """Place a Pending job's instances on hosts and create its first attempt."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(id=job_id).first()
        if job is None or job.phase != Phase.PENDING or _active_attempt(job):
            return False
        if job.terminate_requested:
            _finish(job, Phase.TERMINATED, "Terminated before it started.")
            return True
        hosts = pick_hosts(job.node_count)
        if hosts is None:
            reason = "Waiting for a healthy Docker host: none is enabled and not isolated."
            if job.phase_reason != reason:
                TrainingJob.objects.filter(id=job.id).update(phase_reason=reason)
                announce(job.id)
            return False
        _new_attempt(job, hosts, "initial")
        return True


# -- starting ------------------------------------------------------------------
def _start_container(job: TrainingJob, attempt: Attempt, task_run: TaskRun):
    client = docker_hosts.client_for(task_run.host)
    try:
        container = client.containers.get(task_run.container_name)
    except docker.errors.NotFound:
        container = client.containers.create(**docker_hosts.container_create_kwargs(job, attempt, task_run))
    if container.status == "created":
        container.start()
        container.reload()
    return container


def _describe_start_error(job: TrainingJob, task_run: TaskRun, exc: Exception) -> str:
    if isinstance(exc, docker.errors.ImageNotFound):
        return (
            f"Image '{job.image}' does not exist on host {task_run.host.name}. "
            "Images are built locally (no registry): ask an operator to load it, or pick a preset image."
        )
    if isinstance(exc, docker.errors.APIError):
        return f"Docker refused to start the container on host {task_run.host.name}: {exc.explanation or exc}"
    return f"Docker host {task_run.host.name} could not be reached: {exc}"


def start_attempt(attempt_id: int) -> bool:
    """Create and start the containers of an attempt (idempotent by container name)."""
    attempt = Attempt.objects.select_related("job").filter(id=attempt_id).first()
    if attempt is None or attempt.state != Attempt.State.STARTING:
        return False
    job = attempt.job
    failed: list[int] = []
    for task_run in attempt.task_runs.select_related("host").filter(state=TaskRun.State.CREATED):
        if TrainingJob.objects.filter(id=job.id, terminate_requested=True).exists():
            break
        try:
            container = _start_container(job, attempt, task_run)
        except HOST_ERRORS as exc:
            lost = not isinstance(exc, docker.errors.APIError)
            TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.CREATED).update(
                state=TaskRun.State.LOST if lost else TaskRun.State.START_FAILED,
                error=_describe_start_error(job, task_run, exc),
                ended_at=timezone.now(),
            )
            failed.append(task_run.id)
            continue
        TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.CREATED).update(
            state=TaskRun.State.RUNNING,
            container_id=container.id,
            started_at=docker_time(container.attrs["State"].get("StartedAt")) or timezone.now(),
        )
    now = timezone.now()
    with transaction.atomic():
        moved = Attempt.objects.filter(id=attempt.id, state=Attempt.State.STARTING).update(
            state=Attempt.State.RUNNING, started_at=now
        )
        if moved and not failed:
            TrainingJob.objects.filter(
                id=job.id, phase__in=[Phase.PENDING, Phase.RESTARTING], terminate_requested=False
            ).update(phase=Phase.RUNNING, phase_reason="", started_at=Coalesce(F("started_at"), now))
            RecoveryRecord.objects.filter(next_attempt=attempt, running_again_at=None).update(running_again_at=now)
            announce(job.id)
    if not moved:
        # Stopped while we were starting: nobody else will remove what we made.
        remove_attempt_containers(attempt.id)
        return False
    for task_run_id in attempt.task_runs.filter(state=TaskRun.State.RUNNING).values_list("id", flat=True):
        _dispatch_now("follow_task_run", task_run_id)
    if failed or TrainingJob.objects.filter(id=job.id, terminate_requested=True).exists():
        attempt_may_have_ended(attempt.id)
    return True


def _dispatch_now(task_name: str, *args) -> None:
    from jobs import tasks

    getattr(tasks, task_name).delay(*args)


# -- following and ending -----------------------------------------------------------
def follow_task_run(task_run_id: int) -> bool:
    """Persist a container's log until it ends, then record how it ended."""
    follower = Follower(task_run_id)
    task_run = follower.claim()
    if task_run is None:
        return False
    try:
        while True:
            client = docker_hosts.client_for(task_run.host, timeout=None)
            try:
                container = client.containers.get(task_run.container_id or task_run.container_name)
                follower.follow(task_run, container)
                if follower.lost_ownership:
                    return False
                container.reload()
            except docker.errors.NotFound:
                _mark_lost(task_run, "The container vanished (removed outside the console).")
                break
            except HOST_ERRORS as exc:
                docker_hosts.forget_client(task_run.host)
                if _host_reachable(task_run.host):
                    task_run.refresh_from_db()
                    continue  # a broken stream on a live host: follow again from the last line
                _mark_lost(task_run, f"Docker host {task_run.host.name} became unreachable: {exc}")
                break
            if container.status in ("running", "restarting", "paused"):
                task_run.refresh_from_db()
                continue  # the stream ended early; the container is still alive
            _mark_exited(task_run, container)
            try:
                container.remove(force=True)
            except HOST_ERRORS:
                log.warning("could not remove %s", task_run.container_name)
            break
    finally:
        follower.release()
    attempt_may_have_ended(task_run.attempt_id)
    return True


def _host_reachable(host: DockerHost) -> bool:
    try:
        docker_hosts.client_for(host, timeout=5).ping()
        return True
    except HOST_ERRORS:
        return False


def _mark_exited(task_run: TaskRun, container) -> None:
    state = container.attrs["State"]
    finished = docker_time(state.get("FinishedAt"))
    TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.RUNNING).update(
        state=TaskRun.State.EXITED,
        exit_code=state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
        ended_at=finished or timezone.now(),
    )


def _mark_lost(task_run: TaskRun, reason: str) -> None:
    TaskRun.objects.filter(id=task_run.id, state=TaskRun.State.RUNNING).update(
        state=TaskRun.State.LOST, error=reason, ended_at=timezone.now()
    )


def _failed(task_run: TaskRun) -> bool:
    if task_run.state in (TaskRun.State.START_FAILED, TaskRun.State.LOST):
        return True
    return task_run.state == TaskRun.State.EXITED and task_run.exit_code != 0


def attempt_may_have_ended(attempt_id: int) -> bool:
    """Called whenever one instance ended: end the attempt once its fate is known."""
    attempt = Attempt.objects.select_related("job").get(id=attempt_id)
    runs = list(attempt.task_runs.select_related("host"))
    failed = sorted((r for r in runs if _failed(r)), key=lambda r: r.ended_at or timezone.now())
    done = [r for r in runs if r.state not in (TaskRun.State.CREATED, TaskRun.State.RUNNING)]
    terminating = TrainingJob.objects.filter(id=attempt.job_id, terminate_requested=True).exists()
    if not failed and not terminating and len(done) < len(runs):
        return False  # the others are still working
    if terminating and len(done) < len(runs) and attempt.state == Attempt.State.RUNNING:
        return False  # wait until every container of a stopped job is gone
    # Exactly one caller decides for an attempt.
    if not Attempt.objects.filter(id=attempt.id, state__in=[Attempt.State.STARTING, Attempt.State.RUNNING]).update(
        state=Attempt.State.ENDED, ended_at=timezone.now()
    ):
        return False
    if failed and len(done) < len(runs):
        # Collective training cannot go on with one rank gone: stop the rest.
        stop_attempt_containers(attempt.id)
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(id=attempt.job_id)
        if job.terminate_requested:
            Attempt.objects.filter(id=attempt.id).update(outcome=Attempt.Outcome.TERMINATED)
            _finish(job, Phase.TERMINATED, "Stopped by the user.")
        elif not failed:
            Attempt.objects.filter(id=attempt.id).update(outcome=Attempt.Outcome.SUCCEEDED)
            _finish(job, Phase.COMPLETED, "")
        else:
            Attempt.objects.filter(id=attempt.id).update(outcome=Attempt.Outcome.FAILED)
            _decide_after_failure(job, attempt, failed[0])
    return True


def _finish(job: TrainingJob, phase: str, reason: str) -> None:
    TrainingJob.objects.filter(id=job.id).update(phase=phase, phase_reason=reason, ended_at=timezone.now())
    announce(job.id)


def _decide_after_failure(job: TrainingJob, attempt: Attempt, failed_run: TaskRun) -> None:
    facts = c.EndFacts(
        exit_code=failed_run.exit_code,
        oom_killed=failed_run.oom_killed,
        lost=failed_run.state == TaskRun.State.LOST,
        start_error=failed_run.error if failed_run.state == TaskRun.State.START_FAILED else "",
        log_tail=recent_text(failed_run, 50),
    )
    verdict = c.classify(facts) or c.Classification(c.USER_ERROR, "unknown", "The instance failed.")
    policy = Policy(job.max_restarts_effective, job.unconditional_restart, job.hang_restart)
    counters = Counters(job.restarts_used, job.hang_restarts_used, job.consecutive_unconditional, job.consecutive_hang)
    ran_for = (attempt.ended_at or timezone.now()) - (attempt.started_at or attempt.created_at)
    decision = decide(policy, counters, verdict.failure_class, stable=ran_for.total_seconds() >= STABLE_WINDOW_S)
    after = decision.counters
    TrainingJob.objects.filter(id=job.id).update(
        restarts_used=after.restarts_used,
        hang_restarts_used=after.hang_restarts_used,
        consecutive_unconditional=after.consecutive_unconditional,
        consecutive_hang=after.consecutive_hang,
    )
    next_attempt = None
    if decision.restart:
        hosts = [r.host for r in attempt.task_runs.select_related("host").order_by("index")]
        if decision.level == "job":
            hosts = pick_hosts(job.node_count) or hosts
        next_attempt = _new_attempt(job, hosts, decision.level)
        TrainingJob.objects.filter(id=job.id).update(
            phase=Phase.RESTARTING, phase_reason=f"{verdict.failure_class}: {decision.summary}"
        )
        announce(job.id)
    else:
        evidence = f" (exit code {failed_run.exit_code})" if failed_run.exit_code is not None else ""
        detail = failed_run.error or verdict.explanation
        _finish(job, Phase.FAILED, f"{verdict.failure_class}{evidence}: {detail} Decision: {decision.summary}.")
    if policy.max_restarts > 0:
        RecoveryRecord.objects.create(
            job=job,
            failed_attempt=attempt,
            detected_at=failed_run.ended_at or timezone.now(),
            failure_class=verdict.failure_class,
            rule=verdict.rule,
            explanation=failed_run.error or verdict.explanation,
            task_index=failed_run.index,
            exit_code=failed_run.exit_code,
            oom_killed=failed_run.oom_killed,
            matched_lines=verdict.matched_lines,
            restart=decision.restart,
            level=decision.level,
            decision=decision.summary,
            restarts_used_after=after.restarts_used,
            max_restarts=policy.max_restarts,
            hang_restarts_after=after.hang_restarts_used,
            reschedules_after=job.reschedules_used,
            next_attempt=next_attempt,
        )


# -- stopping ----------------------------------------------------------------------
def request_terminate(job_id) -> bool:
    """The user's Stop: record the wish; the worker converges."""
    with transaction.atomic():
        changed = (
            TrainingJob.objects.filter(id=job_id, terminate_requested=False)
            .exclude(phase__in=FINAL_PHASES)
            .update(terminate_requested=True, terminate_requested_at=timezone.now(), phase=Phase.TERMINATING)
        )
        if changed:
            announce(job_id)
            _dispatch("stop_job", str(job_id))
    return bool(changed)


def stop_attempt_containers(attempt_id: int) -> None:
    for task_run in TaskRun.objects.filter(attempt_id=attempt_id).select_related("host"):
        if task_run.state not in (TaskRun.State.CREATED, TaskRun.State.RUNNING):
            continue
        try:
            docker_hosts.client_for(task_run.host).containers.get(task_run.container_name).stop(timeout=STOP_TIMEOUT_S)
        except docker.errors.NotFound:
            pass
        except HOST_ERRORS as exc:
            log.warning("could not stop %s: %s", task_run.container_name, exc)


def remove_attempt_containers(attempt_id: int) -> None:
    for task_run in TaskRun.objects.filter(attempt_id=attempt_id).select_related("host"):
        try:
            docker_hosts.client_for(task_run.host).containers.get(task_run.container_name).remove(force=True)
        except docker.errors.NotFound:
            pass
        except HOST_ERRORS as exc:
            log.warning("could not remove %s: %s", task_run.container_name, exc)


def stop_job(job_id) -> bool:
    """Stop every container of a job whose termination was requested."""
    job = TrainingJob.objects.filter(id=job_id, terminate_requested=True).first()
    if job is None or job.is_final:
        return False
    attempt = _active_attempt(job)
    if attempt is None:
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().get(id=job_id)
            if not job.is_final and _active_attempt(job) is None:
                _finish(job, Phase.TERMINATED, "Stopped by the user.")
        return True
    if attempt.state == Attempt.State.STARTING and not attempt.task_runs.exclude(state=TaskRun.State.CREATED).exists():
        # Nothing started yet: end the attempt here; start_attempt undoes any
        # container it creates after this point.
        attempt_may_have_ended(attempt.id)
        return True
    stop_attempt_containers(attempt.id)
    # Followers record the exits; this covers task runs that have none.
    attempt_may_have_ended(attempt.id)
    return True
