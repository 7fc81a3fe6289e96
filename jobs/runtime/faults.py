"""Points where a test kills the worker for real (CONSOLE_CRASH_AT=<point> in its
environment), or makes it slow (CONSOLE_PAUSE_AT=<point>): the fault happens exactly where the
test means it to, in the real process, with the real database and engine. Unset in production:
a no-op."""

from __future__ import annotations

import os
import signal
import time


def crash_point(name: str) -> None:
    """SIGKILL this process when CONSOLE_CRASH_AT names this point."""
    if os.environ.get("CONSOLE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def pause_point(name: str) -> None:
    """Sleep CONSOLE_PAUSE_S seconds here when CONSOLE_PAUSE_AT names this point: a step that
    takes long in the real process (a slow database, a busy engine) exactly where a test means it."""
    if os.environ.get("CONSOLE_PAUSE_AT") == name:
        time.sleep(float(os.environ.get("CONSOLE_PAUSE_S", "10")))
