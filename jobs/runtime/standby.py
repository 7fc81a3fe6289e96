"""The next attempt's container, made and started while the current attempt runs: a
container-level restart of a single-instance job is then a "go" to a container that already
runs, not even a `start`.

Made by `prepare` once an attempt of a fault-tolerant single-instance job runs (start.py queues
it): on the same host, for attempt number + 1, exactly as create would make it then (that
attempt's name, labels and MA_ATTEMPT; its code copy and backup staged then), plus the label
STANDBY_LABEL and MA_STANDBY=1. Then `arm` starts it: its launcher waits (launcher.sh step 1);
nothing of the job, not even the environment checks, runs in it before a restart's take-over
writes its go. A restart that lands on that host finds it by name
(start._create_and_start); `take_over` says whether it may be the restart's container.

Not trusted as it was made. Docker resolves bind sources when it starts a container, not when it
creates it, and the job runs meanwhile: it may plant a symbolic link where one of the sources is
(its object storage folders, a file system it writes). So every source is confined and every
grant asked again right before Docker's start (docker_hosts.spec_now), by `arm` (or by the
take-over, for a standby that was not armed); the window between that check and the start is what
it is without a standby. At the take-over the same check runs again, and the whole spec create
would give now (mounts, environment, limits: an operator may have changed the pool meanwhile) is
compared with the standby's, by the fingerprint it carries. A started standby holds the folders it
was started with (a bind mount holds a folder, not its path): each must still be the folder at its
source path (the launcher's answer, device and inode, to a check right before the go), or a job
restarted in it would write where nobody looks. Anything different and the standby is removed and the
restart creates a fresh container (whose staging names what is wrong).

Removed when it can no longer be used: when the job ends (stop.finish), by the next `prepare`
of the same job on that host (a process-level restart kept the old container: the standby is for
an attempt number that will not come), and by reconcile's orphan scan (cleanup.py) for a job
that moved to another host. A standby is a container with STANDBY_LABEL whose control dir holds
no go (labels cannot change): once given its go it is its attempt's container like any other.
"""

from __future__ import annotations

import logging
import os
import secrets
import time

from django.conf import settings

from faulttolerance.launcher import (
    GO,
    MOUNTS_CHECK,
    MOUNTS_REPORT,
    STANDBY_FILES,
    STANDBY_MARK,
    go_text,
    parse_mounts_report,
)
from jobs.models import FINAL_PHASES, RETAINED_PHASES, Attempt, DockerHost, Phase, TaskRun, TrainingJob

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


def job_id_of(container) -> str:
    return labels_of(container).get("console.job", "")


def labels_of(container) -> dict:
    """A container's labels, from a full inspect or a sparse listing."""
    return (container.attrs.get("Config") or {}).get("Labels") or container.attrs.get("Labels") or {}


def status_of(container) -> str:
    """A listing gives the state as a word, an inspect as a dict."""
    state = container.attrs.get("State")
    return (state.get("Status") if isinstance(state, dict) else state) or ""


def is_standby(container) -> bool:
    """Made ahead and not given to its attempt yet: never started, or armed (its control dir
    marked, launcher.sh waiting) and given no go. Labels cannot change: the go the take-over
    writes into the control dir (which the job cannot write) is what ends a standby."""
    if labels_of(container).get(STANDBY_LABEL) != "1":
        return False
    job_id, name = job_id_of(container), name_of(container)
    if engine.read_control_file(job_id, name, GO) is not None:
        return False
    # Started without a mark: a standby's start from before the go existed, its attempt's since.
    return status_of(container) == "created" or engine.read_control_file(job_id, name, STANDBY_MARK) is not None


def standbys_on(host: DockerHost, job_id) -> list:
    """The job's standby containers on the host (not given their go)."""
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
    """Whether `container`, found under this task run's name, may be (or, armed, go on as) this
    task run's. A standby is only if every source is still confined and granted, its spec is what
    create would give now and, armed, it still holds the folders at its sources: then it is given
    its go (its launcher runs the checks and the job once started, or now if armed). Otherwise it
    is removed here (False) and the caller creates a fresh container."""
    if not is_standby(container):
        return True  # a start of this attempt made it (or started it already)
    if not _marked(container):
        return _refuse(container, task_run, f"its making did not finish within {MARK_WAIT_S:g} s")
    if container.status not in ("created", "running"):
        # Armed and ended before its go: killed, or its launcher refused the image.
        return _refuse(container, task_run, f"it is {container.status}")
    why_not, spec = _not_as_made(job, attempt, task_run, container)
    if not why_not and container.status == "running":
        why_not = _holds_other_folders(job, task_run, spec)
    if why_not:
        return _refuse(container, task_run, why_not)
    staging.remove_older_code_copies(job, attempt, task_run)
    engine.write_control_file(job.id, task_run.container_name, GO, go_text(attempt.number))
    engine.wake_launcher(job.id, task_run.container_name)  # an armed one waits for it now
    return True


MARK_WAIT_S = 5.0  # a prepare marks its standby right after Docker's create


def _marked(container) -> bool:
    """Wait until the prepare that made this standby has marked it (its control dir written after
    Docker's create: docker_hosts._mark_standby; the mark names the container, so an earlier
    container's mark left in the dir does not count). A go written before the mark was lost: the
    marking clears whatever an earlier container of the name left, a go included, so a full run
    saw a restart's go erased by a late prepare, the started container taken for a standby
    again, and the console remove its own running attempt ("the container vanished")."""
    job_id, name = job_id_of(container), name_of(container)
    mark = docker_hosts.standby_mark_text(container.id)
    deadline = time.monotonic() + MARK_WAIT_S
    while engine.read_control_file(job_id, name, STANDBY_MARK) != mark:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _not_as_made(job: TrainingJob, attempt: Attempt, task_run: TaskRun, container) -> tuple[str, dict | None]:
    """Why the standby may not start (or run) as this task run's container, or "", and the spec
    create would give now: a source no longer confined or granted, or another spec."""
    try:
        spec = docker_hosts.spec_now(job, attempt, task_run, [task_run.host])
    except staging.StagingError as exc:
        return str(exc), None
    if labels_of(container).get(docker_hosts.SPEC_LABEL) != docker_hosts.spec_fingerprint(spec):
        # An operator changed the pool (its limits, its environment checks), a grant, a flavor...
        return "its spec is not what create would give now", spec
    return "", spec


REPORT_WAIT_S = 2.0  # an armed standby's launcher answers a check within milliseconds


def _holds_other_folders(job: TrainingJob, task_run: TaskRun, spec: dict) -> str:
    """Why an armed standby may not run the job, or "": a bind mount holds the folder its source
    path named at the start, and a folder replaced since (renamed away, deleted and made again;
    or a folder on the way to a mount nested in another, renamed in the outer one) would have the
    restarted job work where nobody looks. Its launcher is asked now (a nonce, so that an earlier
    answer is not taken) for the device and inode of each target as it sees them, and each must
    be its source's as it is now, the source itself and no link (lstat). Fails closed: no answer,
    any difference (a remote host whose share has other device numbers here too), and the
    restart creates a fresh container."""
    name = task_run.container_name
    nonce = secrets.token_hex(8)
    engine.write_control_file(job.id, name, MOUNTS_CHECK, f"{nonce}\n")
    engine.wake_launcher(job.id, name)
    deadline = time.monotonic() + REPORT_WAIT_S
    while (report := parse_mounts_report(engine.read_control_file(job.id, name, MOUNTS_REPORT), nonce)) is None:
        if time.monotonic() > deadline:
            return "its launcher did not answer the check of its mounts"
        time.sleep(0.002)
    sources = docker_hosts.bind_sources(spec)
    if len(report) != len(sources):
        return "not every mount target is there (its launcher's answer is short)"
    for (target, source), held in zip(sources, report, strict=True):
        try:
            now = os.lstat(source)
        except OSError:
            return f"the source of {target} is gone"
        if held != (now.st_dev, now.st_ino):
            return f"the source of {target} is not the folder it was started with"
    return ""


def arm(attempt_id: int) -> bool:
    """Start attempt n + 1's standby (made by `prepare`) while attempt n runs, so that a restart
    is a go and not a `start` (unless settings.STANDBY_ARMED is off). Checked as the take-over
    checks it, right before Docker's start (which resolves the bind sources); its launcher runs
    nothing of the job before its go. True when it was started; a standby left as it was is
    started (or refused) by the take-over."""
    run = (
        TaskRun.objects.select_related("attempt__job", "host")
        .filter(
            attempt_id=attempt_id,
            index=0,
            state=TaskRun.State.RUNNING,
            attempt__state=Attempt.State.RUNNING,
            attempt__job__phase=Phase.RUNNING,
            attempt__job__terminate_requested=False,
            host__enabled=True,
            host__isolated=False,
        )
        .first()
    )
    if run is None or not wanted(run.attempt.job) or not settings.STANDBY_ARMED:
        return False
    attempt, job = run.attempt, run.attempt.job
    name = docker_hosts.container_name(job, attempt.number + 1, 0)
    next_attempt = Attempt(job=job, number=attempt.number + 1, level="container")
    next_run = TaskRun(attempt=next_attempt, index=0, host=run.host, container_name=name)
    try:
        container = engine.container_or_none(run.host, name)
        if container is None or container.status != "created" or not is_standby(container):
            return False
        why_not, spec = _not_as_made(job, next_attempt, next_run, container)
        if why_not:
            log.info("standby %s not armed: %s", name, why_not)  # its take-over refuses it
            return False
        if docker_hosts.has_network_volumes(spec):
            return False  # an NFS export cannot be checked again at the take-over: started then
        engine.start_container(container)
    except HOST_ERRORS as exc:  # removed meanwhile (the job ended), a host gone
        log.info("standby %s not armed: %s", name, exc)
        return False
    return True


def _refuse(container, task_run: TaskRun, why: str) -> bool:
    """Remove a standby that may not be started. Fails closed: a standby that cannot be removed
    fails the start (the engine's error propagates) rather than being found and started again."""
    log.info("standby %s not used: %s", task_run.container_name, why)
    engine.remove_container(container)
    for name in STANDBY_FILES:  # the fresh container of this name uses the same control dir
        engine.remove_control_file(job_id_of(container), task_run.container_name, name)
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
