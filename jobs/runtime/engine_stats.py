"""What a container uses, as its engine measures it: the stats API, one reading at a time.

Part of the engine's edge (jobs/runtime/engine.py), like engine_exec.py: it calls the SDK only
through the handles engine hands out and turns its errors into the console's with
`engine._edge`, so it does not import the SDK itself (tests/test_architecture.py).

The engine reads the container's cgroup on its host: nothing runs in the container, so nothing
the job does (its output, its files, its processes) reaches these numbers. Used by hang
detection (CPU) and the resource charts (CPU and memory), docs/decisions.md "Resource charts".
"""

from __future__ import annotations

from dataclasses import dataclass

from .engine import _edge

STATS_TIMEOUT_S = 5
# `one-shot` (API 1.41, Docker 20.10) answers at once; without it the engine waits for a second
# reading (about 1-2 s), which only an older engine gets.
ONE_SHOT_API = (1, 41)


@dataclass(frozen=True)
class Usage:
    """One reading: None where the engine gave no number (an ended container, an old engine)."""

    cpu_ns: int | None  # the container's cumulative CPU time since it started
    memory_bytes: int | None  # in use, less the page cache the kernel may drop (as `docker stats`)


NO_USAGE = Usage(None, None)


def _api_version(api) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(api._version).split("."))
    except ValueError:
        return ONE_SHOT_API  # "auto" resolved to something unparsable: ask as a current engine


def usage(container, *, timeout_s: float = STATS_TIMEOUT_S) -> Usage:
    """The container's CPU time and memory now, from the engine; raises HOST_ERRORS when the
    engine cannot be asked (bounded by `timeout_s`, whatever the handle's client allows)."""
    with _edge():
        api = container.client.api
        params: dict[str, bool] = {"stream": False}
        if _api_version(api) >= ONE_SHOT_API:
            params["one-shot"] = True
        response = api._get(api._url("/containers/{0}/stats", container.id), params=params, timeout=timeout_s)
        return parse_stats(api._result(response, json=True))


def parse_stats(stats: dict) -> Usage:
    """The numbers of one stats answer (cgroup v1 or v2). An ended container's answer has a
    zero `read` time and empty stats: no reading."""
    if not isinstance(stats, dict) or str(stats.get("read", "")).startswith("0001-01-01"):
        return NO_USAGE
    cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    total = cpu.get("total_usage")
    memory = stats.get("memory_stats") or {}
    used = memory.get("usage")
    if isinstance(used, int):
        details = memory.get("stats") or {}
        # What `docker stats` shows: cgroup v1 names the droppable cache total_inactive_file,
        # v2 inactive_file.
        cache = details.get("total_inactive_file", details.get("inactive_file", 0))
        used = max(0, used - cache) if isinstance(cache, int) and cache < used else used
    return Usage(
        cpu_ns=total if isinstance(total, int) and total >= 0 else None,
        memory_bytes=used if isinstance(used, int) and used >= 0 else None,
    )
