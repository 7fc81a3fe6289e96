"""Real parts for every test: PostgreSQL (pytest-django's test database), Redis,
a Celery worker process, a daphne process, and Docker. Containers made by this
session carry the label console.test=<session> and are removed by label."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import docker
import pytest
from django.conf import settings

from console.worker_argv import worker_argv
from tests.pytest_env import TEST_LABEL, TMP

ROOT = Path(__file__).resolve().parent.parent
BUSYBOX = "console/busybox:latest"
PYTHON_IMAGE = "console/python:3.11"


def pytest_configure(config) -> None:
    """Retry the between-tests flush when PostgreSQL picks it as a deadlock victim.

    The real Celery worker keeps reconciling (a few short queries a second)
    while pytest-django TRUNCATEs every table after a transactional test; when
    the two lock tables in opposite orders PostgreSQL aborts one of them. An
    aborted TRUNCATE changed nothing, so running it again is safe.
    """
    from django.db import OperationalError
    from django.db.backends.postgresql.operations import DatabaseOperations

    flush = DatabaseOperations.execute_sql_flush

    def execute_sql_flush_retrying(self, sql_list):
        for attempt in range(5):
            try:
                return flush(self, sql_list)
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    DatabaseOperations.execute_sql_flush = execute_sql_flush_retrying

    # The flush after a transactional test DELETEs the rows instead of TRUNCATEing the tables:
    # PostgreSQL makes new files for every truncated table (about 200 ms for the suite's tables,
    # after each of some 300 tests), where deleting the few rows a test made takes a millisecond
    # (the foreign keys are deferred: any order). Permissions and content types stay (what a
    # rolled-back test sees too), so Django's post_migrate, which made them again after every
    # flush, has nothing to do.
    # TRUNCATE locked each table against every other writer; DELETE does not, so the flush first
    # takes a lock that only readers share: otherwise the worker, still following a job the test
    # left running, inserts an event between the DELETE of the events and the commit, and the
    # deferred foreign key check fails the commit (CI, stop 16: "still referenced from table
    # jobs_jobevent"). A deadlock against the worker's own transaction is retried above.
    from django.core.management.commands import flush as flush_command

    kept = {"auth_permission", "django_content_type"}

    def sql_flush_deleting(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        emptied = [self.quote_name(table) for table in tables if table not in kept]
        if not emptied:
            return []
        lock = f"LOCK TABLE {', '.join(emptied)} IN SHARE ROW EXCLUSIVE MODE"
        return [lock, *(f"DELETE FROM {table}" for table in emptied)]

    DatabaseOperations.sql_flush = sql_flush_deleting
    flush_command.emit_post_migrate_signal = lambda *args, **kwargs: None

    # Django's test client builds a handler, and so its middleware, for every client a test makes;
    # WhiteNoise's scans every static file when it is made (about 20 ms each time). The files do
    # not change during the run (no autorefresh): scan once, as a server process does.
    from whitenoise.middleware import WhiteNoiseMiddleware

    whitenoise_init = WhiteNoiseMiddleware.__init__
    scanned: dict = {}

    def whitenoise_init_once(self, get_response=None, **kwargs):
        if scanned and not kwargs:
            self.__dict__.update(scanned)
            self.get_response = get_response
            return
        whitenoise_init(self, get_response, **kwargs)
        if not kwargs and not self.autorefresh:
            scanned.update(self.__dict__)

    WhiteNoiseMiddleware.__init__ = whitenoise_init_once


# The suite's three layers, one marker each, given here at collection (`pytest -m unit`, ...):
#   browser      drives a real Chromium: marked `browser`, or uses `new_page`;
#   integration  needs real Docker, the Celery worker or daphne: uses one of INTEGRATION_FIXTURES;
#   unit         the rest: PostgreSQL and Redis at most, no Docker daemon, no worker, no daphne.
# A test that reaches one of them without such a fixture must ask for it (e.g. docker_client).
INTEGRATION_FIXTURES = frozenset(
    {"docker_client", "worker", "celery_worker_process", "daphne_server", "live_url", "second_host"}
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("browser") or "new_page" in fixtures:
            layer = "browser"
        elif item.get_closest_marker("integration") or fixtures & INTEGRATION_FIXTURES:
            layer = "integration"
        else:
            layer = "unit"
        item.add_marker(layer)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Remove this session's scratch folder when everything passed; keep it to read otherwise."""
    import shutil

    if exitstatus == 0:
        shutil.rmtree(TMP, ignore_errors=True)


def _test_db_env() -> dict[str, str]:
    env = dict(os.environ)
    db = settings.DATABASES["default"]
    env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return env


class ManagedProcess:
    """A child process the tests start, kill (SIGKILL, a real fault) and restart."""

    def __init__(self, name: str, argv: list[str], ready=None):
        self.name, self.argv, self.ready = name, argv, ready
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(TMP) / f"{name}.log"

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env=_test_db_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        if self.ready:
            deadline = time.monotonic() + 30
            while not self.ready():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not start:\n{self.log_path.read_text()[-3000:]}")
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker dies mid-task."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._end_group()
            self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._end_group()

    def _end_group(self) -> None:
        """What the process left behind in its group: a worker that killed itself (a crash point)
        left its beat child running, which went on queueing reconciles for the session (seen
        alive 49 minutes later, doubling every reconcile of the later tests)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def docker_client():
    client = docker.from_env()
    client.ping()
    yield client
    _remove_test_containers(client)


def _remove_test_containers(client) -> None:
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


@pytest.fixture(scope="session", autouse=True)
def test_database_released(django_db_setup, django_db_blocker):
    """At the session's end, after its worker and daphne stopped: end whatever connection to the
    session's test database is left (a killed process's backend that PostgreSQL has not reaped
    yet), so that pytest-django can drop the database (else a warning, and the database stays)."""
    yield
    from django.db import connection
    from django.db.backends.base.creation import TEST_DATABASE_PREFIX

    if connection.vendor != "postgresql" or not connection.settings_dict["NAME"].startswith(TEST_DATABASE_PREFIX):
        # No test of this session used the database (tests/test_launcher.py alone), so pytest-django
        # made none: a connection to the name in the settings would wait the pool's whole timeout.
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def _worker_argv(concurrency: str, *extra: str) -> list[str]:
    """A Celery worker of this console on the default and control queues, with threads."""
    queues = [settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_CONTROL_QUEUE]
    return worker_argv(queues, concurrency=int(concurrency), extra=extra)


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup, django_db_blocker, docker_client):
    # docker_client first: its clean-up (every container of this session) then runs after the
    # worker stopped; the other way round, a start the worker made while stopping left a container.
    worker = ManagedProcess(
        "celery-worker",
        _worker_argv("32", "-B", "--schedule", os.path.join(TMP, "beat-schedule")),
    )
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def worker(transactional_db, celery_worker_process, docker_client):
    """The running Celery worker (restarted if a previous test killed it).

    At the end of the test every job is stopped and the worker left idle with
    them before the database is flushed: a worker still deciding holds row
    locks, and the flush would deadlock with it.
    """
    celery_worker_process.ensure_running()
    yield celery_worker_process
    celery_worker_process.ensure_running()  # a fault test may have failed with the worker killed
    try:
        settle_jobs(docker_client=docker_client)
    finally:
        # Even when this test's jobs did not settle (its teardown fails and says why), the next
        # test starts without its containers: one failure must not time out every later test.
        _remove_test_containers(docker_client)


@pytest.fixture
def no_worker(monkeypatch):
    """No Celery task leaves the test (a queued one fails it): for a test in a rolled-back
    transaction, whose work is queued after a commit that never comes."""
    from celery.app.task import Task

    def refuse(task, *args, **kwargs):
        raise AssertionError(f"{task.name} was queued: this test runs without a worker")

    monkeypatch.setattr(Task, "apply_async", refuse)


@pytest.fixture(scope="session")
def daphne_server(django_db_setup):
    port = _free_port()
    daphne = str(Path(sys.executable).with_name("daphne"))
    server = ManagedProcess(
        "daphne",
        [daphne, "-b", "127.0.0.1", "-p", str(port), "--websocket_timeout", "-1", "console.asgi:application"],
        ready=lambda: _answers(port),
    )
    server.url = f"http://127.0.0.1:{port}"
    server.start()
    yield server
    server.stop()


@pytest.fixture
def live_url(daphne_server, worker) -> str:
    daphne_server.ensure_running()
    return daphne_server.url


@functools.cache
def _password_hash(password: str, hashers: tuple[str, ...]) -> str:
    """A real hash of the password, made once a session (the hasher's work per user and test was
    most of a validation test's time). Logging in with it checks it as usual."""
    from django.contrib.auth.hashers import make_password

    return make_password(password)


# Every bucket name the tests use with the demo workspace (tests/test_storage_tenancy.py uses others).
DEMO_BUCKETS = (
    "art-b", "b01", "bk-b", "bk-code-b", "bkt", "bucket", "ckpt-b", "cleanup-bucket", "code-b", "contract-b",
    "copy-b", "data-1", "data-b", "demo", "gone-b", "good", "logs-b", "mnt-b", "nobucket", "nowhere-b", "out-b",
)  # fmt: skip


@pytest.fixture
def demo(db):
    """A workspace with an owner, a member and an outsider, the local Docker host and presets.

    Rows only (the host is a row naming the local engine; nothing here talks to Docker), in the
    test's own database mode: a plain `django_db` test rolls them back, a transactional one (its
    marker, or the `worker` fixture) commits them. The Docker-backed part is `worker` (or
    `docker_client` alone): a test that runs containers asks for it, which makes it integration."""
    return make_demo()


def make_demo():
    """The demo's rows (see `demo`); a module's fixture that commits them calls it itself."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from jobs.models import Bucket, DockerHost, PresetImage, ResourcePool, Workspace

    def user(name: str):  # password: "<name>-password"
        password = _password_hash(f"{name}-password", tuple(settings.PASSWORD_HASHERS))
        return get_user_model().objects.create(username=name, password=password)

    owner, member, outsider = user("owner"), user("member"), user("outsider")
    workspace = Workspace.objects.create(name="team")
    workspace.members.add(owner, member)
    Workspace.objects.create(name="elsewhere").members.add(outsider)
    # Workspaces own their storage: the buckets the tests' jobs use are the team's (registering a
    # name does not make its folder; the tests that need one make it).
    Bucket.objects.bulk_create(Bucket(name=name, workspace=workspace) for name in DEMO_BUCKETS)
    # Small thresholds: the environment checks must pass on a small test disk.
    pool = ResourcePool.objects.create(name="test-pool", check_root_gb=0.5, check_cache_gb=0.5)
    host = DockerHost.objects.create(name="local", base_url=settings.DEFAULT_DOCKER_URL, pool=pool)
    PresetImage.objects.create(name="busybox", image_ref=BUSYBOX)
    PresetImage.objects.create(name="python-3.11-numpy", image_ref=PYTHON_IMAGE)

    class Demo:
        pass

    d = Demo()
    d.owner, d.member, d.outsider, d.workspace, d.host, d.pool = owner, member, outsider, workspace, host, pool
    d.token = Token.objects.create(user=owner).key
    d.outsider_token = Token.objects.create(user=outsider).key
    return d


def flush_database() -> None:
    """Every row gone (what pytest-django does after a transactional test)."""
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)


def wait_for(predicate, timeout: float = 30, interval: float = 0.1, message: str = "condition"):
    """Poll the real system until predicate() is truthy (no sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


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


@pytest.fixture
def second_worker():
    """Another worker process on the same queues, started by the test, without the reconcile
    timer (one beat per console): it runs tasks and follows instances, never reconcile."""
    process = ManagedProcess("celery-worker-2", _worker_argv("8", "-n", "second@%h"))
    yield process
    process.stop()


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


class SecondEngine:
    """A dockerd of our own on a private socket: the host the tests kill."""

    def __init__(self, extra_args: list[str] | None = None):
        # Short paths: the exec root holds sockets, whose paths have a length limit.
        self.dir = tempfile.mkdtemp(prefix="d2-", dir="/tmp")
        self.socket = f"unix://{self.dir}/d.sock"
        self.extra_args = extra_args or []  # e.g. a TLS-verified TCP listener besides the socket
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(os.path.join(self.dir, "dockerd.log"), "ab")
        self.proc = subprocess.Popen(
            [
                "dockerd", "--host", self.socket, "--data-root", f"{self.dir}/data", "--exec-root", f"{self.dir}/x",
                "--pidfile", f"{self.dir}/d.pid", "--bridge=none", "--iptables=false", "--ip-masq=false",
                *self.extra_args,
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self._answers, timeout=30, message="the second dockerd")

    def _answers(self) -> bool:
        try:
            return docker.DockerClient(base_url=self.socket, timeout=2).ping()
        except Exception:
            return False

    def kill(self) -> None:
        """SIGKILL: the host is gone; its containers are orphaned, still running."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def cleanup(self) -> None:
        """Remove everything this engine ran, alive or killed, without restarting it
        (a dockerd restarted after SIGKILL may wait forever on its old containerd)."""
        if self.proc.poll() is None:
            client = docker.DockerClient(base_url=self.socket, timeout=30)
            # sparse: a container a follower removes meanwhile is not an error of the listing
            for container in client.containers.list(all=True, sparse=True):
                try:
                    container.remove(force=True)
                except docker.errors.APIError:
                    pass  # gone, or its removal by a follower is in progress (409): the engine is killed next
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # dockerd and its containerd
        except ProcessLookupError:
            pass
        for procs in glob.glob("/sys/fs/cgroup/*/docker/*/cgroup.procs"):
            container_id = procs.split("/")[-2]
            if os.path.isdir(f"{self.dir}/data/containers/{container_id}"):  # orphans of this engine only
                try:
                    pids = open(procs).read().split()
                except FileNotFoundError:  # its last process ended since the listing: the cgroup went
                    continue
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        subprocess.run(["pkill", "-9", "-f", self.dir], capture_output=True)  # containerd shims
        subprocess.run(["umount", "-R", f"{self.dir}/x"], capture_output=True)
        subprocess.run(["umount", "-R", f"{self.dir}/data"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def second_host(demo, docker_client):
    """A second Docker host ("second", in the demo's pool) on an engine of its own."""
    from jobs.models import DockerHost

    engine = SecondEngine()
    engine.start()
    image = subprocess.run(["docker", "save", BUSYBOX], capture_output=True, check=True).stdout
    docker.DockerClient(base_url=engine.socket, timeout=60).images.load(image)
    host = DockerHost.objects.create(name="second", base_url=engine.socket, pool=demo.pool)
    yield engine, host
    engine.cleanup()
