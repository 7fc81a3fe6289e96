"""Hang judgement (SPEC §6), pure: is an instance stuck, given what was seen of it?

A job is suspected hung when, for a whole window, its processes used almost no CPU, it
wrote no log line and, where it has GPUs, no GPU was busy. jobs/runtime/hang.py samples a
container and feeds the samples in; this class only keeps time and judges.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

SAMPLE_EVERY_S = 2.0
IDLE_CPU_FRACTION = 0.02  # below 2% of one core counts as idle


@dataclass
class HangJudge:
    window_s: float
    clock: Callable[[], float] = time.monotonic
    last_activity: float = field(default=0.0)
    last_sample_at: float = field(default=0.0)
    last_cpu_ns: int | None = None
    idle_cpu_fraction: float = 0.0
    gpu_util: float | None = None
    suspected: bool = False

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        now = self.clock()
        self.last_activity = self.last_sample_at = now
        self.last_cpu_ns = None
        self.suspected = False

    def judge(self, got_lines: bool) -> bool:
        """One turn of the follower: True once when a hang becomes suspected."""
        now = self.clock()
        if got_lines:
            self._active(now)
        if self.suspected or now - self.last_activity < self.window_s:
            return False
        self.suspected = True
        return True

    def observe(self, cpu_usage_ns: int | None, gpu_util: float | None) -> None:
        """A sample: the container's cumulative CPU time (None: none taken) and its busiest
        GPU's utilisation (None: no GPU, or none taken)."""
        now = self.clock()
        elapsed = now - self.last_sample_at
        self.last_sample_at = now
        if cpu_usage_ns is not None and self.last_cpu_ns is not None and elapsed > 0:
            self.idle_cpu_fraction = (cpu_usage_ns - self.last_cpu_ns) / 1e9 / elapsed
            if self.idle_cpu_fraction >= IDLE_CPU_FRACTION:
                self._active(now)
        self.last_cpu_ns = cpu_usage_ns
        self.gpu_util = gpu_util
        if gpu_util:
            self._active(now)

    def _active(self, now: float) -> None:
        self.last_activity = now
        self.suspected = False

    def needs_sample(self) -> bool:
        # A job that logs is alive: no exec while lines flow.
        return self.clock() - self.last_activity >= SAMPLE_EVERY_S

    def metrics(self) -> dict:
        return {
            "idle_for_s": round(self.clock() - self.last_activity, 1),
            "window_s": self.window_s,
            "cpu_cores_used": round(self.idle_cpu_fraction, 4),
            "gpu_util_percent": self.gpu_util,
            "log_lines_in_window": 0,
        }
