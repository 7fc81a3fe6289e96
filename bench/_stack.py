"""The production stack for the benchmarks, started by the benchmark itself.

PostgreSQL (a fresh database, migrated), Redis (channel layer and Celery
broker), a separate Celery worker process and a daphne process, and the local
Docker engine: the same parts and settings the test harness (tests/conftest.py)
uses, with DEBUG off. Containers the console makes for a benchmark carry the
labels console.bench=1 and console.bench.run=<run> and the run removes its own
at the end (runs side by side do not remove each other's containers).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from html import unescape
from pathlib import Path
from urllib.parse import urlsplit

from console.worker_argv import worker_argv
from tests.shared import free_port

ROOT = Path(__file__).resolve().parent.parent
BENCH_LABEL = ("console.bench", "1")
RUN_LABEL = "console.bench.run"  # which benchmark run made it: cleanup removes only its own
PYTHON_IMAGE = "console/python:3.11"
BUSYBOX = "console/busybox:latest"

# One persisted log line in a websocket fragment (templates/jobs/_log_lines.html).
LINE_RE = re.compile(r'<div class="ln" data-n="(\d+)">(.*?)</div>', re.S)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def verdict(checks: dict[str, bool], details: list[str] | tuple[str, ...] = ()) -> int:
    """Print each target met or MISSED (then the details: what went wrong), and PASS or FAIL; the
    exit status (0: every target met)."""
    print()
    for what, ok in checks.items():
        print(f"  {'met ' if ok else 'MISSED'} {what}")
    for detail in details:
        print(f"    {detail}")
    ok = all(checks.values())
    print(f"\n-> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def parse_lines(fragment: str) -> list[tuple[int, str]]:
    return [(int(n), unescape(text)) for n, text in LINE_RE.findall(fragment)]


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Stack:
    """Starts PostgreSQL database, worker and daphne; seeds a user, a workspace and the Docker host."""

    def __init__(self, database: str, keep_db: bool = False):
        self.database, self.keep_db = database, keep_db
        pg = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        self.pg_admin_url = pg
        parts = urlsplit(pg)
        self.database_url = f"{parts.scheme}://{parts.netloc}/{database}"
        self.redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")
        self.tmp = tempfile.mkdtemp(prefix="console-bench-")
        self.tag = f"bench{os.getpid()}"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._sessions = threading.local()  # api(): one kept connection per thread

    # -- environment ---------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            DJANGO_SETTINGS_MODULE="console.settings",
            DJANGO_DEBUG="0",
            CHANNELS_PREFIX=f"console-{self.tag}",
            CELERY_QUEUE=f"console-{self.tag}",
            CONSOLE_VAR_DIR=self.tmp,
            CONSOLE_LOG_ROOT=os.path.join(self.tmp, "logs"),
            CONSOLE_CONTAINER_LABELS=f"{BENCH_LABEL[0]}={BENCH_LABEL[1]},{RUN_LABEL}={self.tag}",
            CONSOLE_LOG_LEVEL=os.environ.get("CONSOLE_LOG_LEVEL", "WARNING"),
        )
        return env

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop(keep_tmp=True)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(keep_tmp=exc_type is not None)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        t0 = time.monotonic()
        self._create_database()
        python = sys.executable
        subprocess.run([python, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=self.env(), check=True)
        bindir = Path(sys.executable).parent
        self._spawn(
            "celery-worker",
            worker_argv(
                [f"console-{self.tag}", f"console-{self.tag}.control"],
                concurrency=32,
                loglevel=os.environ.get("CONSOLE_LOG_LEVEL", "WARNING"),
                extra=("-B", "--schedule", os.path.join(self.tmp, "beat-schedule")),
            ),
        )
        daphne = [
            str(bindir / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(self.port),
            "--websocket_timeout",
            "-1",
            "console.asgi:application",
        ]
        self._spawn("daphne", daphne)
        deadline = time.monotonic() + 30
        while not _answers(self.port):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("daphne did not start")
            time.sleep(0.1)
        self._seed()
        print(
            f"stack: PostgreSQL {self.database}, Redis {self.redis_url}, worker + daphne on {self.url} "
            f"({time.monotonic() - t0:.1f} s to start)"
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(os.path.join(self.tmp, f"{name}.log"), "ab")
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append((name, proc))

    def _check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                log = Path(self.tmp, f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log}")

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def _seed(self) -> None:
        """User, workspace, Docker host and API token, through the ORM of this process."""
        os.environ.update(self.env())
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        from jobs.models import DockerHost, Workspace

        user = get_user_model().objects.create_user("bench", password="bench-password")
        workspace = Workspace.objects.create(name="bench")
        workspace.members.add(user)
        DockerHost.objects.create(name="local", base_url=settings.DEFAULT_DOCKER_URL)
        self.project_id = workspace.project_id
        self.token = Token.objects.create(user=user).key
        from django.db import connections

        connections.close_all()

    def stop(self, keep_tmp: bool = False) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.procs.clear()
        remove_bench_containers(self.tag)
        if not self.keep_db:
            try:
                import psycopg

                with psycopg.connect(self.pg_admin_url, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            except Exception as exc:  # the numbers are printed already
                print(f"could not drop {self.database}: {exc}")
        if keep_tmp or os.environ.get("BENCH_KEEP_TMP"):
            print(f"kept the logs of the worker and daphne in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- API and websocket helpers -------------------------------------------------
    def api(self, method: str, path: str, **kwargs):
        """One API call over this thread's kept connection, as an API client or a browser keeps
        one (a new connection per call measured the client's and daphne's connection set-up)."""
        import requests

        session = getattr(self._sessions, "session", None)
        if session is None:
            session = self._sessions.session = requests.Session()
        headers = {"Authorization": f"Token {self.token}"}
        return session.request(method, f"{self.url}/v2/{self.project_id}{path}", headers=headers, timeout=30, **kwargs)

    def create_job(self, name: str, image: str, command: str) -> str:
        body = {
            "kind": "job",
            "metadata": {"name": name},
            "algorithm": {"command": command, "engine": {"image_url": image}},
            "spec": {"resource": {"node_count": 1}},
        }
        response = self.api("POST", "/training-jobs", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"create failed: {response.status_code} {response.text}")
        return response.json()["metadata"]["id"]

    def job(self, job_id: str) -> dict:
        return self.api("GET", f"/training-jobs/{job_id}").json()

    def wait_phase(self, job_id: str, phases: set[str], timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            phase = self.job(job_id)["status"]["phase"]
            if phase in phases:
                return phase
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} is {phase} after {timeout} s")
            self._check_alive()
            time.sleep(0.1)

    def session_cookie(self) -> str:
        """Log in through the login page, as the browser does; the websockets use the session."""
        import requests

        session = requests.Session()
        page = session.get(f"{self.url}/accounts/login/", timeout=30)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        response = session.post(
            f"{self.url}/accounts/login/",
            data={"username": "bench", "password": "bench-password", "csrfmiddlewaretoken": csrf, "next": "/"},
            headers={"Referer": f"{self.url}/accounts/login/"},
            timeout=30,
        )
        response.raise_for_status()
        return "; ".join(f"{k}={v}" for k, v in session.cookies.items())

    def ws_url(self, path: str) -> str:
        return self.url.replace("http://", "ws://") + path

    async def job_container(self, job_id: str, timeout: float = 60):
        """The job's running container, as the console named and labelled it."""
        import asyncio

        import docker

        from bench._docker import job_own

        client = docker.from_env()
        deadline = time.monotonic() + timeout
        while True:
            found = job_own(client.containers.list(filters={"label": f"console.job={job_id}"}))
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise RuntimeError(f"the container of job {job_id} did not start in {timeout} s")
            self._check_alive()
            await asyncio.sleep(0.05)


def remove_bench_containers(run: str | None = None) -> None:
    """Containers of one run (its tag), or every benchmark container, then their volumes and
    networks: the run stops its worker before the console releases an ended job's /cache volumes
    (the supervisor benchmark left 240 a run)."""
    import docker

    label = f"{RUN_LABEL}={run}" if run else f"{BENCH_LABEL[0]}={BENCH_LABEL[1]}"
    client = docker.from_env()
    for container in client.containers.list(all=True, filters={"label": label}):
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass
    for volume in client.volumes.list(filters={"label": label}):
        try:
            volume.remove(force=True)
        except docker.errors.APIError:
            pass
    for network in client.networks.list(filters={"label": label}):
        try:
            network.remove()
        except docker.errors.APIError:
            pass
    client.close()
