"""What the tests do with the real system: submit a job the way the form and the API do, wait for
the system (never sleep), settle every job after a test, find a job's container and instance, make
the worker die or pause at a point, and remove what this session left in Docker (by its label);
read a row again, a job's phase and end, make unsaved rows and a dedicated pool, call the API with a token."""

from __future__ import annotations

import signal
from contextlib import contextmanager

import docker

from tests.pytest_env import TEST_LABEL
from tests.shared import wait_for  # noqa: F401 (the tests import it from here too)

BUSYBOX = "console/busybox:latest"
PYTHON_IMAGE = "console/python:3.11"


def busybox_with_tools(docker_client, command: list[str]):
    """A bare busybox container of this session (its label) running `command`, with the console's
    tools mounted where an exec's wrapper finds them (`timeout`): no job, no console around it."""
    from jobs.runtime import engine

    return docker_client.containers.run(
        BUSYBOX,
        command,
        detach=True,
        labels=dict([TEST_LABEL]),
        mounts=[engine.bind_mount(engine.TOOLS_MOUNT, str(engine.runtime_tools_dir()), read_only=True)],
    )


def build_image(docker_client, tag: str, dockerfile: str) -> None:
    """An image built here from `dockerfile` alone (no context, no network: FROM a local image)."""
    import io
    import tarfile

    data = dockerfile.encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        entry = tarfile.TarInfo("Dockerfile")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    context.seek(0)
    docker_client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, network_mode="none")


def remove_test_containers(client) -> None:
    # sparse: a full listing inspects each container and fails on one removed meanwhile.
    for container in client.containers.list(all=True, sparse=True, filters={"label": "=".join(TEST_LABEL)}):
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass
    # The jobs' /cache and NFS volumes carry the session's label too (staging.volume_labels).
    for volume in client.volumes.list(filters={"label": "=".join(TEST_LABEL)}):
        try:
            volume.remove(force=True)
        except docker.errors.APIError:
            pass
    # And the multi-instance jobs' own networks (docker_hosts.job_network, one per attempt).
    for network in client.networks.list(filters={"label": "=".join(TEST_LABEL)}):
        try:
            network.remove()
        except docker.errors.APIError:
            pass


def flush_database() -> None:
    """Every row gone (what pytest-django does after a transactional test)."""
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)


@contextmanager
def worker_dying_at(celery_worker_process, monkeypatch, point: str):
    """The worker restarted to SIGKILL itself at `point` (jobs/runtime/faults.py crash_point): the
    block submits what reaches it and waits for the death; afterwards the worker runs again,
    without the crash point."""
    celery_worker_process.stop()
    monkeypatch.setenv("CONSOLE_CRASH_AT", point)
    celery_worker_process.start()
    monkeypatch.delenv("CONSOLE_CRASH_AT")
    try:
        yield lambda: wait_for(
            lambda: celery_worker_process.proc.poll() is not None, timeout=40, message="the worker to die"
        )
    finally:
        celery_worker_process.ensure_running()


@contextmanager
def worker_pausing_at(celery_worker_process, monkeypatch, point: str, seconds: float):
    """The worker restarted to sleep `seconds` at `point` (jobs/runtime/faults.py pause_point)
    for the block; afterwards it is restarted without the pause."""
    celery_worker_process.stop()
    monkeypatch.setenv("CONSOLE_PAUSE_AT", point)
    monkeypatch.setenv("CONSOLE_PAUSE_S", str(seconds))
    celery_worker_process.start()
    monkeypatch.delenv("CONSOLE_PAUSE_AT")
    monkeypatch.delenv("CONSOLE_PAUSE_S")
    try:
        yield
    finally:
        celery_worker_process.stop()
        celery_worker_process.start()


def settle_jobs(timeout: float = 60, docker_client=None) -> None:
    """Stop every unfinished job and wait until no worker is busy with any of them
    and (given a Docker client) none of their containers is left."""
    from jobs.models import FINAL_PHASES, Attempt, TaskRun, TrainingJob
    from jobs.runtime import stop

    for job_id in TrainingJob.objects.exclude(phase__in=FINAL_PHASES).values_list("id", flat=True):
        stop.request_terminate(job_id)

    def quiet() -> bool:
        return (
            not TrainingJob.objects.exclude(phase__in=FINAL_PHASES).exists()
            and not Attempt.objects.filter(state__in=[Attempt.State.STARTING, Attempt.State.RUNNING]).exists()
            and not TaskRun.objects.filter(follower_token__isnull=False).exists()
        )

    def no_containers() -> bool:
        # sparse: a plain list inspects each container and fails on one removed meanwhile.
        return not docker_client.containers.list(all=True, sparse=True, filters={"label": "=".join(TEST_LABEL)})

    try:
        wait_for(quiet, timeout=timeout, interval=0.2, message="every job final and no follower left")
        if docker_client is not None:
            wait_for(no_containers, timeout=timeout, interval=0.2, message="no container left")
    except AssertionError as exc:
        left = []
        if docker_client is not None:
            for c in docker_client.containers.list(all=True, sparse=True, filters={"label": "=".join(TEST_LABEL)}):
                labels = c.attrs.get("Labels") or {}
                left.append(
                    f"  container {(c.attrs.get('Names') or ['?'])[0]} {c.attrs.get('State')} "
                    f"job={labels.get('console.job')} attempt={labels.get('console.attempt')}"
                )
        raise AssertionError(f"{exc}:\n{describe()}\n" + "\n".join(left)) from None


def describe() -> str:
    """Where each job of the test stands, for a failure message."""
    from jobs.models import TaskRun, TrainingJob

    out = []
    for job in TrainingJob.objects.order_by("created_at"):
        out.append(f"job {job.name} {job.id}: {job.phase} terminate={job.terminate_requested} {job.phase_reason!r}")
        for attempt in job.attempts.order_by("number"):
            out.append(f"  attempt {attempt.number} {attempt.state} {attempt.outcome!r} level={attempt.level}")
            for run in TaskRun.objects.filter(attempt=attempt):
                out.append(
                    f"    run {run.index} {run.state} exit={run.exit_code} follower={run.follower_token} "
                    f"lines={run.log_lines} {run.error!r}"
                )
    return "\n".join(out)


def job_container(docker_client, job_id):
    """The job's running container, or None. A fault-tolerant job also runs its next attempt's
    standby (jobs/runtime/standby.py, armed: its launcher waits for a restart's go): the job's own
    container is the one of the lowest attempt. Sparse: a full listing inspects each container
    and fails on one removed meanwhile; the container is then inspected by its id."""
    listed = docker_client.containers.list(sparse=True, filters={"label": f"console.job={job_id}"})
    if not listed:
        return None
    first = min(listed, key=lambda c: int((c.attrs.get("Labels") or {}).get("console.attempt", 0)))
    try:
        return docker_client.containers.get(first.id)
    except docker.errors.NotFound:
        return None


def running_instance(job, index: int = 0, timeout: float = 60):
    """The job's instance `index` (its task run) once it runs in its container."""
    from jobs.models import TaskRun

    return wait_for(
        lambda: (
            TaskRun.objects.filter(attempt__job=job, index=index, state=TaskRun.State.RUNNING)
            .exclude(container_id="")
            .first()
        ),
        timeout=timeout,
        message=f"worker-{index} running",
    )


def submit_job(demo, **fields):
    """Create a job the way the form and the API do (full_clean, save, submit)."""
    from jobs.models import TrainingJob
    from jobs.runtime import schedule

    defaults = dict(workspace=demo.workspace, created_by=demo.owner, name="job", image=BUSYBOX, command="echo hi")
    job = TrainingJob(**(defaults | fields))
    job.full_clean()
    job.save()
    schedule.submit(job)
    return job


# -- a job's state and rows ----------------------------------------------------------------------
def reload(row):
    """The row (a job, a task run), read again from the database: for wait_for's lambdas."""
    row.refresh_from_db()
    return row


def phase(job) -> str:
    """The job's phase as the database has it now."""
    return reload(job).phase


def ended(job) -> bool:
    """The job, read again, is Completed, Failed or Terminated."""
    job.refresh_from_db()
    return job.is_final


def unsaved(demo, **fields):
    """A job of the demo workspace that is never saved: what the layout, the mounts and a
    container's settings are computed from before a job exists."""
    from jobs.models import TrainingJob

    return TrainingJob(
        **(dict(workspace=demo.workspace, created_by=demo.owner, image=BUSYBOX, command="true") | fields)
    )


def instance_of(job, demo) -> tuple:
    """An unsaved first attempt of the job and its instance 0 on the demo host."""
    from jobs.models import Attempt, TaskRun

    attempt = Attempt(job=job, number=1)
    return attempt, TaskRun(attempt=attempt, index=0, host=demo.host, container_name="unused")


def dedicated_pool(demo):
    """A dedicated pool holding the test host (file system and object storage mounts are dedicated-only)."""
    from jobs.models import ResourcePool

    pool = ResourcePool.objects.create(name="dedicated", kind="dedicated", check_root_gb=0.5, check_cache_gb=0.5)
    demo.host.pool = pool
    demo.host.save(update_fields=["pool"])
    return pool


def run_of(job, attempt: int = 1):
    """The attempt's first instance once its container ran: running, or already ended (a short
    command can end between two looks on a busy machine, and then it was never seen running)."""
    from jobs.models import TaskRun

    return wait_for(
        lambda: (
            TaskRun.objects.filter(
                attempt__job=job,
                attempt__number=attempt,
                state__in=[TaskRun.State.RUNNING, TaskRun.State.EXITED, TaskRun.State.LOST],
            )
            .exclude(container_id="")
            .first()
        ),
        message=f"attempt {attempt}'s container to run",
    )


def log_texts(task_run) -> list[str]:
    """The persisted log of an instance, a text per line."""
    from jobs.runtime.logs import read_lines

    task_run.refresh_from_db()
    return [line.text for line in read_lines(task_run)]


# -- the API ---------------------------------------------------------------------------------------
def api_client(token: str):
    """DRF's test client sending this API token."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def api_log(demo, job, task: str = "worker-0", **params):
    """An instance's log through the API, read with the demo owner's token."""
    return api_client(demo.token).get(
        f"/v2/{demo.workspace.project_id}/training-jobs/{job.id}/tasks/{task}/logs", params
    )


class StillWaiting(BaseException):
    """Raised by no_longer_than: not an OSError (TimeoutError is one, and a view or parser that
    turns an OSError into a refusal would swallow it)."""


@contextmanager
def no_longer_than(seconds: int):
    """Code that could block or spin for good (a read of a job's FIFO, a regular expression on a
    job's line) fails the test after `seconds` instead of hanging the suite: SIGALRM, main thread."""

    def expired(signum, frame):
        raise StillWaiting(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
