"""The processes the tests start, kill (a real fault) and start again: the Celery workers, daphne,
the embedded console; and the loopback ports they listen on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from django.conf import settings

from tests.pytest_env import TMP
from tests.shared import free_port  # noqa: F401 (the tests import it from here too)

ROOT = Path(__file__).resolve().parent.parent


# The stand-in `ssh` (tests/bin/ssh): an ssh:// Docker host of a test reaches this machine's engine
# through it, from the tests and from every process they start; each start is logged here.
STAND_IN_SSH_DIR = ROOT / "tests" / "bin"
STARTED_SSH_LOG = Path(TMP) / "ssh-started.log"


def test_db_env() -> dict[str, str]:
    """The environment of a process the tests start: this session's test database, and the
    stand-in `ssh` first on its PATH (forwarding to this machine's engine)."""
    env = dict(os.environ)
    db = settings.DATABASES["default"]
    env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env["PATH"] = f"{STAND_IN_SSH_DIR}{os.pathsep}{env.get('PATH', '')}"
    env["CONSOLE_TEST_SSH_LOG"] = str(STARTED_SSH_LOG)
    env["CONSOLE_TEST_SSH_ENGINE"] = env.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    env.pop("CONSOLE_TEST_SSH_MODE", None)
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
            self.argv, cwd=ROOT, env=test_db_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
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


def answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
