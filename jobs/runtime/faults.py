"""Points where a test kills the worker for real (CONSOLE_CRASH_AT=<point> in its
environment): the fault happens exactly where the test means it to, in the real
process, with the real database and engine. Unset in production: a no-op."""

from __future__ import annotations

import os
import signal


def crash_point(name: str) -> None:
    """SIGKILL this process when CONSOLE_CRASH_AT names this point."""
    if os.environ.get("CONSOLE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
