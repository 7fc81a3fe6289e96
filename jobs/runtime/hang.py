"""Hang detection (SPEC §6): CPU, log output and, where present, GPU use.

A follower asks its HangWatch on every tick; the watch samples the
container's CPU time from its engine (one `stats` reading, engine_stats.py:
remote-safe, and nothing runs in the container, so the job cannot touch it)
every few seconds, and reports a suspected hang when, for the whole window, the
CPU stayed below the threshold, no log line arrived and no GPU was busy. The
same samples feed the instance's resource chart (resources.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from faulttolerance.hang import SAMPLE_EVERY_S, HangJudge

from .engine import MA_USER
from .engine_exec import exec_bounded
from .engine_stats import NO_USAGE, Usage
from .engine_stats import usage as container_usage

log = logging.getLogger(__name__)

SAMPLE_TIMEOUT_S = 5
STACKS_TIMEOUT_S = 30
STACKS_MAX_BYTES = 256 * 1024

# Returns the utilisation (0-100) of the container's busiest GPU, or None.
GpuSampler = Callable[[object], float | None]


def no_gpu(container) -> float | None:
    return None


def nvidia_smi_gpu(container) -> float | None:
    """GPU flavors: the busiest GPU's utilisation, from nvidia-smi inside the container (the
    image's: the engine gives no GPU use). Bounded in time and output; only makes the job look
    busy, never ends anything."""
    result = exec_bounded(
        container,
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
        user=MA_USER,
        timeout_s=SAMPLE_TIMEOUT_S,
        max_bytes=4096,
    )
    if result.exit_code != 0:
        return None
    values = [float(v) for v in result.stdout.decode(errors="replace").split() if v.replace(".", "", 1).isdigit()]
    return max(values) if values else None


@dataclass(frozen=True)
class Sample:
    """One reading of an instance: when (the console's clock, epoch seconds), what the engine
    measured, and the busiest GPU's use (None: no GPU, or none taken)."""

    at: float
    usage: Usage
    gpu_util: float | None


class SampleSink(Protocol):
    """Where the Sampler also hands samples (the instance's resource chart, resources.py)."""

    def due(self) -> bool: ...

    def record(self, sample: Sample) -> None: ...


@dataclass
class HangWatch(HangJudge):
    """The judgement (faulttolerance/hang.py) fed with this container's samples.

    tick() is called by the follower on every loop turn and does no I/O when
    a Sampler thread feeds it (sample_inline=False): a `docker exec` in the
    log loop would delay every log line behind it.
    """

    gpu_sampler: GpuSampler = no_gpu
    sample_inline: bool = True
    unmeasured_noted: bool = False

    def tick(self, container, got_lines: bool) -> bool:
        """Returns True once when a hang becomes suspected."""
        if self.sample_inline and self.clock() - self.last_sample_at >= SAMPLE_EVERY_S:
            self.sample(container)
        suspected = self.judge(got_lines)
        silent_for = self.clock() - self.last_activity
        if not suspected and silent_for >= self.window_s and not self.window_measured():
            if not self.unmeasured_noted:  # once per silence: an operator learns why no hang is judged
                self.unmeasured_noted = True
                log.warning(
                    "silent for %.0f s but its CPU was measured idle for only %.0f s: no hang judged",
                    silent_for,
                    self.measured_idle_s(),
                )
        elif silent_for < self.window_s:
            self.unmeasured_noted = False
        return suspected

    def sample(self, container) -> Sample:
        """One CPU (and GPU) sample, judged and returned; errors mean "no sample" (the
        follower sees the container end)."""
        try:
            usage = container_usage(container)
        except Exception:
            usage = NO_USAGE
        try:
            gpu = self.gpu_sampler(container)
        except Exception:
            gpu = None
        self.observe(usage.cpu_ns, gpu)
        return Sample(time.time(), usage, gpu)


class Sampler(threading.Thread):
    """Feeds a HangWatch with CPU/GPU samples beside the log loop, and the instance's resource
    chart (`sink`) with one of them every few seconds."""

    def __init__(self, watch: HangWatch, container, sink: SampleSink | None = None):
        super().__init__(daemon=True, name="hang-sampler")
        self.watch, self.container, self.sink = watch, container, sink
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_EVERY_S):
            try:
                self.turn()
            except Exception:  # nothing ends this thread: without samples no hang is judged
                log.exception("sampling a container failed")

    def turn(self) -> None:
        chart = self.sink is not None and self.sink.due()
        if chart or self.watch.needs_sample():
            sample = self.watch.sample(self.container)
            if chart:
                try:
                    self.sink.record(sample)
                except Exception:  # a chart's point is never worth the hang watch
                    log.exception("recording a resource sample failed")
        else:
            self.watch.last_cpu_ns = None  # the next sample starts a fresh interval

    def stop(self) -> None:
        self.stopped.set()


STACKS_CMD = [
    "sh",
    "-c",
    # py-spy where the image has it: one dump per Python process (not the launcher).
    "command -v py-spy >/dev/null 2>&1 || { echo 'py-spy is not in this image'; exit 0; }; "
    # Match the executable, not the command line: the user's `sh -c "python3 ..."` is not Python.
    'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; '
    "case $(readlink $d/exe 2>/dev/null) in *python*) py-spy dump --pid $p 2>&1;; esac; done",
]


def capture_stacks(container) -> str:
    """Where a hung Python process is stuck, before it is restarted (bounded: 30 s, 256 KB)."""
    try:
        result = exec_bounded(
            container, STACKS_CMD, user=MA_USER, timeout_s=STACKS_TIMEOUT_S, max_bytes=STACKS_MAX_BYTES
        )
    except Exception as exc:  # the evidence is best effort; the restart must go on
        return f"could not capture stacks: {exc}"
    text = (result.stdout + result.stderr).decode(errors="replace")[-20000:]
    if result.timed_out:
        text += f"\n(py-spy did not finish within {STACKS_TIMEOUT_S} s)"
    return text
