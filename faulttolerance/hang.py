"""Hang judgement (SPEC §6), pure: is an instance stuck, given what was seen of it?

A job is suspected hung when, for a whole window, its processes used almost no CPU, it
wrote no log line and, where it has GPUs, no GPU was busy. jobs/runtime/hang.py samples a
container and feeds the samples in; this class only keeps time and judges.

Idle CPU is a fact only where it was measured: a window in which the engine's CPU counter
could not be read (an engine slowed down, by another team's job for one) is not a hang. The
counter is cumulative, so the interval from the last reading that worked to the next one
measures the whole gap, however many readings failed in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

SAMPLE_EVERY_S = 2.0
IDLE_CPU_FRACTION = 0.02  # below 2% of one core counts as idle
# The first reading comes a sampling period or two after the last activity (the sampler's
# cadence): the measured stretch may be this much shorter than the window.
MEASURE_SLACK_S = 3 * SAMPLE_EVERY_S


@dataclass
class HangJudge:
    window_s: float
    clock: Callable[[], float] = time.monotonic
    last_activity: float = field(default=0.0)
    last_sample_at: float = field(default=0.0)
    last_cpu_ns: int | None = None
    last_cpu_at: float = 0.0  # when last_cpu_ns was read
    # The stretch over which the CPU was measured idle, since the last activity (None: none).
    idle_from: float | None = None
    idle_to: float | None = None
    idle_cpu_fraction: float = 0.0
    gpu_util: float | None = None
    suspected: bool = False

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        now = self.clock()
        self.last_activity = self.last_sample_at = now
        self.last_cpu_ns = None
        self.idle_from = self.idle_to = None
        self.suspected = False

    def judge(self, got_lines: bool) -> bool:
        """One turn of the follower: True once when a hang becomes suspected."""
        now = self.clock()
        if got_lines:
            self._active(now)
        if self.suspected or now - self.last_activity < self.window_s:
            return False
        if not self.window_measured():
            return False  # not seen idle: silence alone, or readings that failed, is no hang
        self.suspected = True
        return True

    def window_measured(self) -> bool:
        """Whether the CPU was measured idle over (nearly) the whole window."""
        return self.measured_idle_s() >= max(SAMPLE_EVERY_S, self.window_s - MEASURE_SLACK_S)

    def measured_idle_s(self) -> float:
        """How long the CPU was measured idle since the last activity."""
        if self.idle_from is None or self.idle_to is None or self.idle_from < self.last_activity:
            return 0.0
        return self.idle_to - self.idle_from

    def observe(self, cpu_usage_ns: int | None, gpu_util: float | None) -> None:
        """A sample: the container's cumulative CPU time (None: none taken) and its busiest
        GPU's utilisation (None: no GPU, or none taken)."""
        now = self.clock()
        self.last_sample_at = now
        if cpu_usage_ns is not None:
            # Measured from the last reading that worked (a failed one keeps it): the counter is
            # cumulative, so the interval covers the readings that failed. A counter that went
            # down belongs to a container the engine started again: that interval measured
            # nothing. (Read once: reset() runs on the follower's thread, this on the sampler's.)
            last_ns, last_at = self.last_cpu_ns, self.last_cpu_at
            measured = last_ns is not None and now > last_at and cpu_usage_ns >= last_ns
            if measured:
                self.idle_cpu_fraction = (cpu_usage_ns - last_ns) / 1e9 / (now - last_at)
                if self.idle_cpu_fraction >= IDLE_CPU_FRACTION:
                    self._active(now)
            if not measured or self.idle_from is None or self.idle_from < self.last_activity:
                self.idle_from = now  # idle is measured from this reading on
            self.idle_to = now
            self.last_cpu_ns, self.last_cpu_at = cpu_usage_ns, now
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
            "cpu_measured_idle_s": round(self.measured_idle_s(), 1),
            "gpu_util_percent": self.gpu_util,
            "log_lines_in_window": 0,
        }
