"""The next attempt's container, made while the current attempt runs: a container-level restart
of a single-instance job is then a `start` of a container that already exists.

Made by `prepare` once an attempt of a fault-tolerant single-instance job runs (start.py queues
it): on the same host, for attempt number + 1, exactly as create would make it then (that
attempt's name, labels and MA_ATTEMPT; its code copy and backup staged then), plus the label
STANDBY_LABEL. A restart that lands on that host finds it by name (start._create_and_start) and
starts it after `take_over` said it may.

Not trusted as it was made: between its create and its start the job ran, and may have planted
a symbolic link where one of its bind sources is (its object storage folders, a file system it
writes); Docker resolves bind sources when it starts a container, not when it creates it.
`take_over` confines every source and asks every grant again right before the start
(docker_hosts.spec_now) and compares the whole spec create would give now (mounts, environment,
limits: an operator may have changed the pool meanwhile) with the standby's, by the fingerprint
it carries; anything different and the standby is removed and the restart creates a fresh
container (whose staging names what is wrong). The window between the check and Docker's start
is what it is without a standby.

Removed when it can no longer be used: when the job ends (stop.finish), by the next `prepare`
of the same job on that host (a process-level restart kept the old container: the standby is for
an attempt number that will not come), and by reconcile's orphan scan (cleanup.py) for a job
that moved to another host. "created" is what marks a standby: once started it is its attempt's
container like any other (labels cannot change).
"""

from __future__ import annotations

import logging

from django.conf import settings

from jobs.models import FINAL_PHASES, RETAINED_PHASES, Attempt, DockerHost, TaskRun, TrainingJob

from . import docker_hosts, engine, staging
from .docker_hosts import STANDBY_LABEL
from .engine import HOST_ERRORS

log = logging.getLogger(__name__)

# A job in one of these will never start a standby (a retained job keeps its containers, not its standby).
ENDED_PHASES = FINAL_PHASES | RETAINED_PHASES


def wanted(job: TrainingJob) -> bool:
    """A standby serves a container-level restart of the one instance of a fault-tolerant job.
    (A multi-instance job's next spec depends on where its instances land: not made ahead.)"""
    return settings.STANDBY_CONTAINERS and job.node_count == 1 and job.max_restarts_effective > 0


def name_of(container) -> str:
    """A container's name, from a full inspect or a sparse listing."""
    return (container.attrs.get("Name") or (container.attrs.get("Names") or ["/"])[0]).lstrip("/")


def labels_of(container) -> dict:
    """A container's labels, from a full inspect or a sparse listing."""
    return (container.attrs.get("Config") or {}).get("Labels") or container.attrs.get("Labels") or {}


def is_standby(container) -> bool:
    """Made ahead and never started: labels cannot change, so a standby once started is told
    apart by its state alone (a listing gives the state as a word, an inspect as a dict)."""
    state = container.attrs.get("State")
    status = state.get("Status") if isinstance(state, dict) else state
    return labels_of(container).get(STANDBY_LABEL) == "1" and status == "created"


def standbys_on(host: DockerHost, job_id) -> list:
    """The job's standby containers on the host (never started)."""
    listed = engine.containers_labelled(host, [f"console.job={job_id}", f"{STANDBY_LABEL}=1"])
    return [c for c in listed if is_standby(c)]


def prepare(attempt_id: int) -> bool:
    """Create attempt n + 1's container beside attempt n's running one; True when one was made.
    Idempotent: a standby already there is kept, one for another attempt number removed."""
    attempt = Attempt.objects.select_related("job").filter(id=attempt_id, state=Attempt.State.RUNNING).first()
    if attempt is None or attempt.job.is_final or attempt.job.terminate_requested or not wanted(attempt.job):
        return False
    job = attempt.job
    run = attempt.task_runs.select_related("host").filter(index=0, state=TaskRun.State.RUNNING).first()
    if run is None or _latest_attempt(job.id) != attempt.number:
        return False
    host = run.host
    name = docker_hosts.container_name(job, attempt.number + 1, 0)
    next_attempt = Attempt(job=job, number=attempt.number + 1, level="container")
    next_run = TaskRun(attempt=next_attempt, index=0, host=host, container_name=name)
    try:
        for stale in standbys_on(host, job.id):
            if name_of(stale) != name:
                remove_quietly(stale, f"attempt {attempt.number} runs: a standby for another attempt is stale")
        if engine.container_or_none(host, name) is not None:
            return False
        container = docker_hosts.create_container(job, next_attempt, next_run, [host], standby=True)
    except HOST_ERRORS as exc:
        # A name taken (409: a restart's create won), a source missing (StagingError), a host
        # gone: the restart, if one comes, creates its container as it would without a standby.
        log.info("no standby for %s: %s", name, exc)
        return False
    if not _still_wanted(job.id, attempt.number, name, host):
        remove_quietly(container, "the job ended or moved on while it was being made")
        return False
    return True


def _latest_attempt(job_id) -> int | None:
    return Attempt.objects.filter(job_id=job_id).order_by("-number").values_list("number", flat=True).first()


def _still_wanted(job_id, number: int, name: str, host: DockerHost) -> bool:
    """Asked after the create: a job that ended, or moved on, while the standby was being made
    would otherwise keep it (the end's removal may have listed the host before it existed).
    The latest attempt before the runs (as the orphan scan reads them): a restart that creates
    the next attempt in between shows its task run, committed with it, to the second query."""
    latest = _latest_attempt(job_id)
    if TaskRun.objects.filter(container_name=name, host=host).exists():
        return True  # taken over already by the restart it was made for
    job = TrainingJob.objects.filter(id=job_id).values("phase", "terminate_requested").first()
    if job is None or job["terminate_requested"] or job["phase"] in ENDED_PHASES:
        return False
    return latest == number


def take_over(job: TrainingJob, attempt: Attempt, task_run: TaskRun, container) -> bool:
    """Whether `container`, found under this task run's name, may be started for it. A standby
    is only if every source is still confined and granted and its mounts are what create would
    give now; otherwise it is removed here (False) and the caller creates a fresh container."""
    if not is_standby(container):
        return True  # a start of this attempt made it (or started it already)
    try:
        now = docker_hosts.spec_fingerprint(docker_hosts.spec_now(job, attempt, task_run, [task_run.host]))
    except staging.StagingError as exc:
        return _refuse(container, task_run, str(exc))
    if labels_of(container).get(docker_hosts.SPEC_LABEL) != now:
        # An operator changed the pool (its limits, its environment checks), a grant, a flavor...
        return _refuse(container, task_run, "its spec is not what create would give now")
    staging.remove_older_code_copies(job, attempt, task_run)
    return True


def _refuse(container, task_run: TaskRun, why: str) -> bool:
    """Remove a standby that may not be started. Fails closed: a standby that cannot be removed
    fails the start (the engine's error propagates) rather than being found and started again."""
    log.info("standby %s not used: %s", task_run.container_name, why)
    engine.remove_container(container)
    return False


def remove_quietly(container, why: str) -> None:
    """Remove a standby, saying why (every removal is logged: a standby gone unexpectedly is a
    restart that creates its container again)."""
    try:
        engine.remove_container(container)
        log.info("removed standby container %s: %s", name_of(container), why)
    except HOST_ERRORS as exc:
        log.info("could not remove standby %s (%s): %s", name_of(container), why, exc)


def remove_for_job(job_id) -> bool:
    """The ended job's standbys on every host it ran on; True when any was removed."""
    removed = False
    host_ids = TaskRun.objects.filter(attempt__job_id=job_id).values_list("host_id", flat=True).distinct()
    for host in DockerHost.objects.filter(id__in=host_ids, enabled=True, isolated=False):
        try:
            for container in standbys_on(host, job_id):
                remove_quietly(container, "its job ended")
                removed = True
        except HOST_ERRORS as exc:
            log.info("standbys of %s on %s stay for now: %s", job_id, host.name, exc)
    return removed
