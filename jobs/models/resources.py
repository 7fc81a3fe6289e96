"""What each instance (task run) used over its life: CPU, memory and GPU, as the engine and the
console's own checks measured them (jobs/runtime/resources.py; docs/decisions.md "Resource
charts"). Never anything the job printed or wrote.

One row per task run holds a bounded series: at most MAX_POINTS points packed in a binary
column (POINT.size = 18 bytes a point, about 13 KB a row at most). When it is full,
neighbouring points are merged pairwise and its resolution (`step_s`) doubles, so a week-long
run still has at most 720 points (of about 21 minutes each at a 10 s sample).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import models
from django.utils import timezone

from .runs import TaskRun

__all__ = ["MAX_POINTS", "POINT", "Point", "ResourceSeries", "Series"]

# end (s after the origin), span (s, ending at end), CPU (millicores), memory (KiB), GPU (0.1 %)
POINT = struct.Struct("<IIIIH")
NONE_32 = 0xFFFFFFFF  # "no value" of the 32-bit fields
NONE_16 = 0xFFFF
MAX_POINTS = 720


@dataclass(frozen=True)
class Point:
    """One point: averages over (end - span, end]; memory is the peak of what was merged into it."""

    end: int
    span: int
    cpu_milli: int | None = None
    memory_kib: int | None = None
    gpu_permille: int | None = None

    @property
    def start(self) -> int:
        return self.end - self.span


def _weighted(a: int | None, wa: int, b: int | None, wb: int) -> int | None:
    if a is None or b is None:
        return a if b is None else b
    return round((a * wa + b * wb) / max(1, wa + wb))


def merge(a: Point, b: Point) -> Point:
    """Two neighbours as one: CPU and GPU averaged by time (exact for CPU, whose samples are
    differences of a cumulative counter), memory's peak kept (the number that explains an OOM)."""
    memory = [m for m in (a.memory_kib, b.memory_kib) if m is not None]
    return Point(
        end=b.end,
        span=b.end - a.start,  # covers both, and a gap between them (a follower's downtime)
        cpu_milli=_weighted(a.cpu_milli, a.span, b.cpu_milli, b.span),
        memory_kib=max(memory) if memory else None,
        gpu_permille=_weighted(a.gpu_permille, a.span, b.gpu_permille, b.span),
    )


@dataclass
class Series:
    """The bounded series of one task run; `add` keeps it within MAX_POINTS."""

    step_s: int
    points: list[Point] = field(default_factory=list)

    def add(self, point: Point) -> None:
        last = self.points[-1] if self.points else None
        # After a halving, samples come faster than the resolution: they fill the last point
        # until it covers a step (half a sample of slack for the sampler's jitter).
        if last is not None and point.start == last.end and last.span + point.span <= self.step_s + point.span // 2:
            self.points[-1] = merge(last, point)
        else:
            self.points.append(point)
        if len(self.points) > MAX_POINTS:
            pairs = zip(self.points[0::2], self.points[1::2], strict=False)
            merged = [merge(a, b) for a, b in pairs]
            if len(self.points) % 2:
                merged.append(self.points[-1])
            self.points = merged
            self.step_s *= 2

    def pack(self) -> bytes:
        def n32(value: int | None) -> int:
            return NONE_32 if value is None else min(max(0, value), NONE_32 - 1)

        def n16(value: int | None) -> int:
            return NONE_16 if value is None else min(max(0, value), NONE_16 - 1)

        return b"".join(
            POINT.pack(p.end, p.span, n32(p.cpu_milli), n32(p.memory_kib), n16(p.gpu_permille)) for p in self.points
        )

    @classmethod
    def unpack(cls, data: bytes, step_s: int) -> Series:
        usable = len(data) - len(data) % POINT.size
        points = [
            Point(
                end,
                span,
                None if cpu == NONE_32 else cpu,
                None if memory == NONE_32 else memory,
                None if gpu == NONE_16 else gpu,
            )
            for end, span, cpu, memory, gpu in POINT.iter_unpack(bytes(data[:usable]))
        ]
        return cls(step_s=step_s, points=points)


class ResourceSeries(models.Model):
    """The resource use of one task run over its life (written in batches by the worker that
    follows it; the database is where the chart reads it, so it survives a worker restart)."""

    task_run = models.OneToOneField(TaskRun, primary_key=True, on_delete=models.CASCADE, related_name="resource_series")
    origin = models.DateTimeField(help_text="The points' times are seconds after this.")
    step_s = models.PositiveIntegerField(help_text="A point's resolution now; doubles each time the series halves.")
    points = models.BinaryField(default=bytes, help_text="Packed points (jobs/models/resources.py POINT).")
    cpu_ns = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="The container's cumulative CPU time at the last point's end: a follower that adopts "
        "the run goes on from it.",
    )
    cpu_limit_millicores = models.PositiveIntegerField(null=True, blank=True)
    memory_limit_kib = models.PositiveBigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"resources of task run {self.task_run_id}"

    def series(self) -> Series:
        return Series.unpack(self.points or b"", self.step_s)

    def at(self, offset_s: int) -> datetime:
        return self.origin + timedelta(seconds=offset_s)
