"""The command line of a console Celery worker (threads) for the worker processes the test suite
and the benchmarks start (the README gives an operator's)."""

from __future__ import annotations

import sys
from pathlib import Path


def worker_argv(
    queues: list[str], *, concurrency: int, loglevel: str = "INFO", extra: tuple[str, ...] = ()
) -> list[str]:
    """`celery worker` of this virtualenv on `queues`, with `concurrency` threads. No heartbeat,
    mingle or gossip: the console's workers share their state through the database, not Celery's
    broadcasts, and each costs messages at start and while it runs."""
    celery = str(Path(sys.executable).with_name("celery"))
    return [
        celery, "-A", "console", "worker", "--pool", "threads", "--concurrency", str(concurrency),
        "-Q", ",".join(queues), *extra, "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", loglevel,
    ]  # fmt: skip
