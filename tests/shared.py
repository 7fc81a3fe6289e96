"""What the benchmarks share with the tests: bench/ imports this module and tests/second_engine.py.

Importing them changes nothing: no Django, no settings read, no environment rewritten (importing
tests.pytest_env, as tests/helpers.py and tests/processes.py do, gives the process a test
session's database, queue and labels). tests/test_architecture.py holds both modules to that.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30, interval: float = 0.1, message: str = "condition") -> T:
    """Poll the real system until predicate() is truthy and return its value (no sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
