"""The Resources tab's data: each instance's CPU, memory and GPU over the job's life, across
attempts, from the stored series (jobs/models/resources.py), shaped for uPlot (one time axis
per instance; the page aligns them)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from django.conf import settings

from jobs.models import ResourceSeries, TrainingJob
from jobs.models.resources import Point, merge

# What the page draws per instance: a long job's many runs are merged further for the chart.
DISPLAY_POINTS = 1000


@dataclass
class InstanceUse:
    """One instance's row of the summary table and its chart data."""

    index: int
    runs: int = 0
    points: list[Point] = field(default_factory=list)  # times in s after the job's first origin
    cpu_limit: float | None = None  # cores
    memory_limit_mb: float | None = None

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    def _last(self, attr: str) -> int | None:
        return next((getattr(p, attr) for p in reversed(self.points) if getattr(p, attr) is not None), None)

    @property
    def cpu_now(self) -> float | None:
        value = self._last("cpu_milli")
        return None if value is None else round(value / 1000, 2)

    @property
    def memory_now_mb(self) -> float | None:
        value = self._last("memory_kib")
        return None if value is None else round(value / 1024, 1)

    @property
    def memory_peak_mb(self) -> float | None:
        values = [p.memory_kib for p in self.points if p.memory_kib is not None]
        return round(max(values) / 1024, 1) if values else None

    @property
    def gpu_now(self) -> float | None:
        value = self._last("gpu_permille")
        return None if value is None else round(value / 10, 1)

    @property
    def has_gpu(self) -> bool:
        return any(p.gpu_permille is not None for p in self.points)

    def chart(self, base: float) -> dict:
        """Times (epoch s, a point at its end) and values; a null row where the instance was not
        measured (between attempts, while no follower ran), which uPlot draws as a gap."""
        t: list[float] = []
        cpu: list[float | None] = []
        memory: list[float | None] = []
        gpu: list[float | None] = []
        previous_end = None
        for p in _fewer(self.points, DISPLAY_POINTS):
            if previous_end is not None and p.start > previous_end + 1:
                t.append(round(base + (previous_end + p.start) / 2, 1))
                cpu.append(None)
                memory.append(None)
                gpu.append(None)
            t.append(round(base + p.end, 1))
            cpu.append(None if p.cpu_milli is None else round(p.cpu_milli / 1000, 3))
            memory.append(None if p.memory_kib is None else round(p.memory_kib / 1024, 1))
            gpu.append(None if p.gpu_permille is None else round(p.gpu_permille / 10, 1))
            previous_end = p.end
        return {"name": self.name, "t": t, "cpu": cpu, "memory": memory, "gpu": gpu}


def _fewer(points: list[Point], most: int) -> list[Point]:
    """Neighbours merged pairwise until at most `most` are left (only for drawing)."""
    while len(points) > most:
        merged = [merge(a, b) for a, b in zip(points[0::2], points[1::2], strict=False)]
        if len(points) % 2:
            merged.append(points[-1])
        points = merged
    return points


def page_context(job: TrainingJob) -> dict:
    """The Resources tab: per instance its summary and chart data, oldest attempt first."""
    rows = (
        ResourceSeries.objects.filter(task_run__attempt__job=job)
        .select_related("task_run__attempt")
        .order_by("task_run__index", "task_run__attempt__number")
    )
    rows = list(rows)
    base = min((row.origin.timestamp() for row in rows), default=0.0)
    instances: dict[int, InstanceUse] = {}
    for row in rows:
        use = instances.setdefault(row.task_run.index, InstanceUse(row.task_run.index))
        use.runs += 1
        # One time base for the job: each run's offsets moved from its own origin to it.
        shift = round(row.origin.timestamp() - base)
        use.points.extend(replace(p, end=p.end + shift) for p in row.series().points)
        if row.cpu_limit_millicores:
            use.cpu_limit = row.cpu_limit_millicores / 1000
        if row.memory_limit_kib:
            use.memory_limit_mb = round(row.memory_limit_kib / 1024, 1)
    shown = [use for _, use in sorted(instances.items()) if use.points]
    memory_limits = {use.memory_limit_mb for use in shown}
    cpu_limits = {use.cpu_limit for use in shown}
    has_gpu = any(use.has_gpu for use in shown)
    return {
        "resource_instances": shown,
        "resource_has_gpu": has_gpu,
        "resource_sample_s": settings.RESOURCE_SAMPLE_S,
        "resource_poll_s": max(2, round(settings.RESOURCE_FLUSH_S)),
        "resource_chart": {
            "instances": [use.chart(base) for use in shown],
            # One limit line when every instance has the same (the usual case: one flavor).
            "memory_limit_mb": memory_limits.pop() if len(memory_limits) == 1 else None,
            "cpu_limit": cpu_limits.pop() if len(cpu_limits) == 1 else None,
            "gpu": has_gpu,
        },
    }
