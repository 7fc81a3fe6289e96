"""Resource charts' samples (docs/decisions.md "Resource charts").

Each follower's Sampler (hang.py) hands one of its engine samples to the instance's
ResourceRecorder every RESOURCE_SAMPLE_S; the recorder turns it into a point of the task run's
bounded series (jobs/models/resources.py) in memory. One ResourceWriter thread per worker
process writes every series that changed, in one statement, every RESOURCE_FLUSH_S: 200
instances followed by a process make one upsert of 200 rows every 10 s, not 20 writes a second.
The row is the truth: a follower that adopts a run (its worker died) goes on from it.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from django.conf import settings
from django.db import IntegrityError, connection
from django.utils import timezone

from jobs.models import ResourceSeries, TaskRun
from jobs.models.resources import Point

from . import dbpool
from .hang import Sample
from .logs import docker_time

log = logging.getLogger(__name__)

UPDATED_FIELDS = ["origin", "step_s", "points", "cpu_ns", "cpu_limit_millicores", "memory_limit_kib", "updated_at"]


def container_limits(container) -> tuple[int | None, int | None]:
    """CPU (millicores) and memory (KiB) limits the container was created with, from the engine's
    inspect (the handle's attrs); None where it has none."""
    config = (getattr(container, "attrs", None) or {}).get("HostConfig") or {}
    cpu = None
    if config.get("NanoCpus"):
        cpu = round(config["NanoCpus"] / 1e6)
    elif config.get("CpuQuota", 0) > 0 and config.get("CpuPeriod"):
        cpu = round(1000 * config["CpuQuota"] / config["CpuPeriod"])
    memory = config.get("Memory") or None
    return cpu, (memory // 1024 if memory else None)


def container_started(container) -> datetime | None:
    state = (getattr(container, "attrs", None) or {}).get("State") or {}
    return docker_time(state.get("StartedAt"))


class _Run:
    """The series of one task run, in memory, and whether the database has all of it."""

    def __init__(self, task_run_id: int, row: ResourceSeries, baseline: tuple[int, float] | None):
        self.task_run_id = task_run_id
        self.row = row
        self.series = row.series()
        self.baseline = baseline  # (cumulative CPU ns, epoch s) the next point starts from
        self.dirty = False
        self.closed = False
        self.lock = threading.Lock()

    def add(self, sample: Sample) -> None:
        with self.lock:
            cpu_ns, now = sample.usage.cpu_ns, sample.at
            if cpu_ns is None and sample.usage.memory_bytes is None:
                return  # no reading (the container is ending): the next point spans this one
            if self.baseline is None:
                if cpu_ns is not None:
                    self.baseline = (cpu_ns, now)  # a run adopted without a row: from here on
                return
            base_ns, base_at = self.baseline
            origin = self.row.origin.timestamp()
            start, end = round(base_at - origin), round(now - origin)
            if end <= start:
                return
            cpu_milli = None
            if cpu_ns is not None:
                if cpu_ns < base_ns:  # a counter that went back: another container's; restart from it
                    self.baseline = (cpu_ns, now)
                    return
                cpu_milli = round((cpu_ns - base_ns) / 1e6 / max(now - base_at, 1e-3))
            memory = sample.usage.memory_bytes
            self.series.add(
                Point(
                    end=end,
                    span=end - start,
                    cpu_milli=cpu_milli,
                    memory_kib=None if memory is None else memory // 1024,
                    gpu_permille=None if sample.gpu_util is None else round(sample.gpu_util * 10),
                )
            )
            if cpu_ns is not None:
                self.baseline = (cpu_ns, now)
                self.row.cpu_ns = cpu_ns
            self.dirty = True

    def take(self) -> ResourceSeries | None:
        """The row to write when something changed since the last write (then it is clean)."""
        with self.lock:
            if not self.dirty:
                return None
            self.dirty = False
            row = ResourceSeries(
                task_run_id=self.task_run_id,
                origin=self.row.origin,
                step_s=self.series.step_s,
                points=self.series.pack(),
                cpu_ns=self.row.cpu_ns,
                cpu_limit_millicores=self.row.cpu_limit_millicores,
                memory_limit_kib=self.row.memory_limit_kib,
                updated_at=timezone.now(),
            )
            return row

    def unwritten(self) -> None:
        with self.lock:
            self.dirty = True


def _open_run(task_run: TaskRun, container, carried: tuple[int, float] | None) -> _Run:
    """The run's series: its row when one exists (an adopted run), else a new one whose first
    point starts where the previous run in this container ended (`carried`, a process-level
    restart) or at the container's start (its CPU counter starts at 0 there)."""
    row = ResourceSeries.objects.filter(task_run_id=task_run.id).first()
    if row is not None:
        series = row.series()
        if row.cpu_ns is not None:
            last_end = series.points[-1].end if series.points else 0
            return _Run(task_run.id, row, (row.cpu_ns, row.origin.timestamp() + last_end))
        return _Run(task_run.id, row, carried)
    now = time.time()
    baseline = carried
    if baseline is None and not task_run.reuses_container:
        started = container_started(container)
        if started is not None:
            baseline = (0, min(started.timestamp(), now))
    cpu_limit, memory_limit = container_limits(container)
    row = ResourceSeries(
        task_run_id=task_run.id,
        origin=datetime.fromtimestamp(baseline[1] if baseline else now, tz=UTC),
        step_s=max(1, round(settings.RESOURCE_SAMPLE_S)),
        cpu_limit_millicores=cpu_limit,
        memory_limit_kib=memory_limit,
    )
    return _Run(task_run.id, row, baseline)


class ResourceRecorder:
    """The resource chart of one followed container: the Sampler's sink (hang.SampleSink).
    Its series go to the process's ResourceWriter; `switch` starts the next run's series in
    the same container (a process-level restart), `close` hands the last one over."""

    def __init__(self, task_run: TaskRun, container, writer: ResourceWriter | None = None):
        self.container = container
        self.every_s = settings.RESOURCE_SAMPLE_S
        self.writer = writer or local_writer()
        self._last_taken = float("-inf")
        self._lock = threading.Lock()
        self.run: _Run | None = _open_run(task_run, container, None)
        self.writer.add(self.run)

    def due(self) -> bool:
        # A little early rather than a whole sampler turn late.
        return time.monotonic() - self._last_taken >= self.every_s - 0.5

    def record(self, sample: Sample) -> None:
        self._last_taken = time.monotonic()
        with self._lock:
            run = self.run
        if run is not None:
            run.add(sample)

    def switch(self, task_run: TaskRun) -> None:
        with self._lock:
            previous, self.run = self.run, None
        carried = None
        if previous is not None:
            previous.closed = True
            with previous.lock:
                carried = previous.baseline
        try:
            nxt = _open_run(task_run, self.container, carried)
        except Exception:  # the database is away: this run has no chart, the follower goes on
            log.exception("no resource chart for task run %s", task_run.id)
            nxt = None
        with self._lock:
            self.run = nxt
        if nxt is not None:
            self.writer.add(nxt)
        self.writer.wake()

    def close(self) -> None:
        with self._lock:
            run = self.run
        if run is not None:
            run.closed = True
        self.writer.wake()  # the last points land now, not a flush interval later


class ResourceWriter:
    """Writes the series of this process's followers in batches, from one thread of its own."""

    def __init__(self, every_s: float | None = None):
        self.every_s = every_s or settings.RESOURCE_FLUSH_S
        self._runs: list[_Run] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, run: _Run) -> None:
        with self._lock:
            self._runs.append(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_forever, name="resource-writer", daemon=True)
                self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._runs)

    def _write_forever(self) -> None:
        while True:
            self._wake.wait(self.every_s)
            self._wake.clear()
            try:
                self.flush()
                dbpool.release_connection_if_pooled()
            except Exception:  # the database is away: the rows stay dirty for the next round
                log.exception("writing resource series failed")
                connection.close()

    def flush(self) -> int:
        """Write every changed series in one statement; returns how many it took to write."""
        with self._lock:
            runs = list(self._runs)
        taken = [(run, row) for run in runs if (row := run.take()) is not None]
        try:
            _upsert_alive(taken)
        except Exception:
            for run, _ in taken:
                run.unwritten()
            raise
        with self._lock:
            self._runs = [run for run in self._runs if not (run.closed and not run.dirty)]
        return len(taken)


def _upsert_alive(taken: list[tuple[_Run, ResourceSeries]]) -> None:
    try:
        _upsert([row for _, row in taken])
    except IntegrityError:
        # A task run deleted meanwhile (its job was deleted): write the others, forget it.
        ids = [run.task_run_id for run, _ in taken]
        alive = set(TaskRun.objects.filter(id__in=ids).values_list("id", flat=True))
        for run, _ in taken:
            if run.task_run_id not in alive:
                run.closed = True
        _upsert([row for run, row in taken if run.task_run_id in alive])


def _upsert(rows: list[ResourceSeries]) -> None:
    if rows:
        ResourceSeries.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["task_run"], update_fields=UPDATED_FIELDS
        )


_writer: ResourceWriter | None = None
_writer_lock = threading.Lock()


def local_writer() -> ResourceWriter:
    """This process's writer (one per worker process, started with its first series)."""
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = ResourceWriter()
        return _writer
