"""Real parts for every test: PostgreSQL (pytest-django's test database), Redis,
a Celery worker process, a daphne process, and Docker. Containers made by this
session carry the label console.test=<session> and are removed by label.

The fixtures and the suite's hooks only; what tests import lives in modules of its own (a
conftest is not imported as a module): tests/helpers.py (submit, wait, settle), tests/demo.py
(the demo's rows), tests/processes.py (processes the tests start and kill),
tests/second_engine.py (a second Docker engine), tests/browser_page.py (what drives a page in
Chromium), tests/browser_network.py (the browser's own network), tests/wsclient.py (websockets),
tests/folders.py (the folders a job mounts), tests/bounded_calls.py (engines that stop answering)
and tests/permission_cast.py (callers and their rights)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
from django.conf import settings
from playwright.sync_api import sync_playwright

from console.worker_argv import worker_argv
from tests.browser_network import BrowserNetwork
from tests.browser_page import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, CHROMIUM_MISSING, page_maker
from tests.demo import make_demo
from tests.helpers import BUSYBOX, remove_test_containers, settle_jobs
from tests.processes import ManagedProcess, answers, free_port
from tests.pytest_env import TMP
from tests.second_engine import SecondEngine


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

    if exitstatus == 0:
        shutil.rmtree(TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_client():
    client = docker.from_env()
    client.ping()
    yield client
    remove_test_containers(client)


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
        remove_test_containers(docker_client)


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
    port = free_port()
    daphne = str(Path(sys.executable).with_name("daphne"))
    server = ManagedProcess(
        "daphne",
        [daphne, "-b", "127.0.0.1", "-p", str(port), "--websocket_timeout", "-1", "console.asgi:application"],
        ready=lambda: answers(port),
    )
    server.port, server.url = port, f"http://127.0.0.1:{port}"
    server.start()
    yield server
    server.stop()


@pytest.fixture
def live_url(daphne_server, worker) -> str:
    daphne_server.ensure_running()
    return daphne_server.url


@pytest.fixture(scope="session")
def browser_network(daphne_server):
    """The browser's network namespace, with daphne's port forwarded into it: the Docker host's
    bridges, made and removed by every multi-instance job, do not fail its requests there
    (tests/browser_network.py)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(CHROMIUM_MISSING)
    network = BrowserNetwork([daphne_server.port])
    try:
        network.start()
    except BaseException:
        network.stop()  # what it made before the failure
        raise
    yield network
    network.stop()


@pytest.fixture(scope="module")
def browser(browser_network):
    """Chromium, once for each test module that drives pages, in the session's browser network. A
    launch of the headless shell costs ~0.1 s of CPU; what a browser test costs is drawing its pages."""
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(browser_network.chromium), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def new_page(browser, live_url):
    """Pages in fresh browser contexts (one user each); closed after the test."""
    with page_maker(browser, live_url) as make:
        yield make


@pytest.fixture
def demo(db):
    """A workspace with an owner, a member and an outsider, the local Docker host and presets.

    Rows only (the host is a row naming the local engine; nothing here talks to Docker), in the
    test's own database mode: a plain `django_db` test rolls them back, a transactional one (its
    marker, or the `worker` fixture) commits them. The Docker-backed part is `worker` (or
    `docker_client` alone): a test that runs containers asks for it, which makes it integration."""
    return make_demo()


@pytest.fixture
def second_worker():
    """Another worker process on the same queues, started by the test, without the reconcile
    timer (one beat per console): it runs tasks and follows instances, never reconcile."""
    process = ManagedProcess("celery-worker-2", _worker_argv("8", "-n", "second@%h"))
    yield process
    process.stop()


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
