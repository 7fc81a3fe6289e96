"""Tracing the worker's Docker API calls for restart_latency.py (an instrumented copy: no app code changes)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from bench._stack import Stack


def ms(ns: int | float) -> float:
    return ns / 1e6


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- tracing the worker's Docker calls (an instrumented copy: no app code changes) ---------------------
# Written into the stack's temporary folder as sitecustomize.py and put on the worker's PYTHONPATH:
# every HTTP request a Docker client makes in that process is logged with its start and end time.
TRACE_SITECUSTOMIZE = """
import os, threading, time
_path = os.environ.get("BENCH_DOCKER_TRACE")
if _path:
    try:
        import docker.api.client as _dc
    except Exception:
        _dc = None
    if _dc is not None:
        _send = _dc.APIClient.send
        _lock = threading.Lock()

        def send(self, request, **kwargs):
            t0 = time.time_ns()
            try:
                return _send(self, request, **kwargs)
            finally:
                t1 = time.time_ns()
                thread = threading.current_thread().name
                line = f"{t0} {t1} {os.getpid()} {thread} {request.method} {request.path_url}\\n"
                with _lock, open(_path, "a") as f:
                    f.write(line)

        _dc.APIClient.send = send
_sql_path = os.environ.get("BENCH_SQL_TRACE")
if _sql_path:
    # Every statement and commit the process sends PostgreSQL, in the Docker trace's format (its
    # "method" SQL, its "endpoint" the statement's first words): one timeline of both.
    try:
        import psycopg as _pg
    except Exception:
        _pg = None
    if _pg is not None:
        _execute, _commit = _pg.Cursor.execute, _pg.Connection.commit
        _slock = threading.Lock()

        def _sql_line(t0, what):
            thread = threading.current_thread().name.replace(" ", "_")
            what = " ".join(str(what).split())[:90]
            with _slock, open(_sql_path, "a") as f:
                f.write(f"{t0} {time.time_ns()} {os.getpid()} {thread} SQL {what}\\n")

        def execute(self, query, *args, **kwargs):
            t0 = time.time_ns()
            try:
                return _execute(self, query, *args, **kwargs)
            finally:
                _sql_line(t0, query)

        def commit(self):
            t0 = time.time_ns()
            try:
                return _commit(self)
            finally:
                _sql_line(t0, "COMMIT")

        _pg.Cursor.execute = execute
        _pg.Connection.commit = commit
_pool_path = os.environ.get("BENCH_POOL_TRACE")
if _pool_path:
    # Every wait for a pooled database connection that took over 2 ms, and by which thread.
    try:
        import psycopg_pool as _pp
    except Exception:
        _pp = None
    if _pp is not None:
        _getconn = _pp.ConnectionPool.getconn
        _plock = threading.Lock()

        def getconn(self, *args, **kwargs):
            t0 = time.time_ns()
            try:
                return _getconn(self, *args, **kwargs)
            finally:
                t1 = time.time_ns()
                if t1 - t0 > 2_000_000:
                    thread = threading.current_thread().name
                    with _plock, open(_pool_path, "a") as f:
                        f.write(f"{t0} {t1} {thread}\\n")

        _pp.ConnectionPool.getconn = getconn
_gc_path = os.environ.get("BENCH_GC_TRACE")
if _gc_path:
    # Every garbage collection over 5 ms: when, which generation, how long (it holds the GIL).
    import gc as _gc
    _gc_started = [0]

    def _gc_callback(phase, info):
        if phase == "start":
            _gc_started[0] = time.perf_counter_ns()
        else:
            took = time.perf_counter_ns() - _gc_started[0]
            if took > 5_000_000:
                with open(_gc_path, "a") as f:
                    gen, got = info.get("generation"), info.get("collected")
                    f.write(f"{time.time_ns()} {gen} {took // 1000} {got} {os.getpid()}\\n")

    _gc.callbacks.append(_gc_callback)
_census_path = os.environ.get("BENCH_GC_CENSUS")
if _census_path:
    # Every 60 s: the objects the collector tracks (frozen ones apart), by type (set by hand: each
    # census walks every object, a pause of its own).
    import collections as _collections
    import gc as _gc2

    def _census():
        while True:
            time.sleep(60)
            objs = _gc2.get_objects()
            top = _collections.Counter(type(o).__qualname__ for o in objs).most_common(25)
            with open(_census_path, "a") as f:
                frozen, threads = _gc2.get_freeze_count(), threading.active_count()
                f.write(f"{os.getpid()} {len(objs)} frozen={frozen} threads={threads} {top}\\n")
            del objs

    threading.Thread(target=_census, daemon=True, name="bench-census").start()
_task_path = os.environ.get("BENCH_TASK_TRACE")
if _task_path:
    # When each task was sent (in the sending process) and began in the worker.
    try:
        import celery.app.task as _ct
        from celery.signals import task_prerun as _prerun
    except Exception:
        _ct = None
    if _ct is not None:
        _apply = _ct.Task.apply_async
        _tlock = threading.Lock()

        def apply_async(self, args=None, kwargs=None, **options):
            t0 = time.time_ns()
            try:
                return _apply(self, args, kwargs, **options)
            finally:
                with _tlock, open(_task_path, "a") as f:
                    f.write(f"SENT {t0} {time.time_ns()} {self.name} {(args or [''])[0]}\\n")

        _ct.Task.apply_async = apply_async

        def _began(sender=None, args=None, **kw):
            with _tlock, open(_task_path, "a") as f:
                f.write(f"BEGAN {time.time_ns()} 0 {getattr(sender, 'name', '')} {(args or [''])[0]}\\n")

        _prerun.connect(_began, weak=False)
_hold_path = os.environ.get("BENCH_POOL_HOLDS")
if _hold_path:
    # Every pooled connection held over 20 ms: for how long, by which thread, taken where. Set
    # by hand (BENCH_POOL_HOLDS=/path in the bench's environment): it costs a stack per checkout.
    import traceback as _tb
    try:
        import psycopg_pool as _pp2
    except Exception:
        _pp2 = None
    if _pp2 is not None:
        _get2, _put2 = _pp2.ConnectionPool.getconn, _pp2.ConnectionPool.putconn
        _held = {}
        _hlock = threading.Lock()

        def getconn2(self, *args, **kwargs):
            conn = _get2(self, *args, **kwargs)
            where = " < ".join(
                f"{f.name}:{os.path.basename(f.filename)}:{f.lineno}"
                for f in reversed(_tb.extract_stack(limit=14)[:-1])
                if "site-packages" not in f.filename and "sitecustomize" not in f.filename
            )
            _held[id(conn)] = (time.time_ns(), threading.current_thread().name, where)
            return conn

        def putconn2(self, conn, *args, **kwargs):
            got = _held.pop(id(conn), None)
            if got is not None:
                held = time.time_ns() - got[0]
                if held > 20_000_000:
                    with _hlock, open(_hold_path, "a") as f:
                        f.write(f"{got[0]} {held // 1000} {got[1]} {got[2]}\\n")
            return _put2(self, conn, *args, **kwargs)

        _pp2.ConnectionPool.getconn = getconn2
        _pp2.ConnectionPool.putconn = putconn2
"""


def enable_docker_trace(stack: Stack, *, sql: bool = False) -> Path:
    """The worker's Docker calls (and with `sql`, its statements and commits: ~30 us each, so
    off where a benchmark's figure is the target) logged to the returned file."""
    folder = Path(stack.tmp, "trace")
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(TRACE_SITECUSTOMIZE)
    trace = Path(stack.tmp, "docker-trace.log")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    os.environ["BENCH_DOCKER_TRACE"] = str(trace)
    if sql:
        os.environ["BENCH_SQL_TRACE"] = str(trace)  # the same file: lines with the method SQL
    return trace


def read_trace(path: Path) -> list[tuple[int, int, str, str, str]]:
    """(start ns, end ns, thread, method, endpoint with ids replaced)."""
    import re

    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split(" ", 5)
        if len(parts) != 6:
            continue
        t0, t1, _pid, thread, method, url = parts
        endpoint = re.sub(r"/containers/[^/?]+", "/containers/{id}", url.split("?")[0])
        endpoint = re.sub(r"/exec/[^/?]+", "/exec/{id}", re.sub(r"^/v[0-9.]+", "", endpoint))
        out.append((int(t0), int(t1), thread, method, endpoint))
    return out


def trace_breakdown(trace: list, windows: list[tuple[int, int]], title: str) -> None:
    """The worker's Docker calls that began inside each (from, to) window, by endpoint."""
    by_endpoint: dict[str, list[float]] = {}
    for start, end in windows:
        for t0, t1, _thread, method, endpoint in trace:
            if start <= t0 <= end and method != "SQL" and "/events" not in endpoint and "/logs" not in endpoint:
                by_endpoint.setdefault(f"{method} {endpoint}", []).append(ms(t1 - t0))
    print(f"\n{title}: the worker's Docker API calls (median ms per call; calls per restart)")
    for key, values in sorted(by_endpoint.items(), key=lambda kv: -median(kv[1]) * len(kv[1])):
        print(f"  {key:<62} {median(values):8.1f}   ({len(values) / max(1, len(windows)):.1f} per restart)")
