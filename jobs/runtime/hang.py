"""Hang detection (SPEC §6): CPU, log output and, where present, GPU use.

A follower asks its HangWatch on every tick; the watch samples the
container's CPU time from its engine (one `stats` reading, engine_stats.py:
remote-safe, and nothing runs in the container, so the job cannot touch it)
every few seconds, and reports a suspected hang when, for the whole window, the
CPU stayed below the threshold, no log line arrived and no GPU was busy. The
same samples feed the instance's resource chart (resources.py).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from faulttolerance.hang import SAMPLE_EVERY_S, HangJudge

from .engine import MA_USER, EngineError, on_this_thread
from .engine_exec import exec_bounded
from .engine_stats import NO_USAGE, Usage
from .engine_stats import usage as container_usage

log = logging.getLogger(__name__)

SAMPLE_TIMEOUT_S = 5
SAMPLE_CLIENT_TIMEOUT_S = 10  # a sampling thread's client: any call it makes beyond its own bound
# The threads that turn every followed container's Sampler (SamplingPool), and the most turns
# of one engine under way at once; the pool grows past SAMPLER_THREADS (to SAMPLER_THREADS_MAX)
# only while engines that do not answer hold threads.
SAMPLER_THREADS = 8
SAMPLER_THREADS_MAX = 64
# A thread started past SAMPLER_THREADS leaves after this long without a turn (with it go its
# clients of the engines, jobs/runtime/engine.client_for: a client and a connection per thread).
SAMPLER_IDLE_S = 60.0
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

    tick() is called by the follower on every loop turn and does no I/O when a
    Sampler feeds it from the SamplingPool (sample_inline=False): a `docker exec`
    in the log loop would delay every log line behind it.
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
        return self._observed(usage, gpu)

    def missed(self) -> Sample:
        """A "no sample" without asking: the container could not even be reached."""
        return self._observed(NO_USAGE, None)

    def _observed(self, usage: Usage, gpu: float | None) -> Sample:
        self.observe(usage.cpu_ns, gpu)
        return Sample(time.time(), usage, gpu)


class Sampler:
    """Feeds a HangWatch with CPU/GPU samples beside the log loop, and the instance's resource
    chart (`sink`) with one of them every few seconds. Its turns run on the process's
    SamplingPool, not on a thread of its own (docs/decisions.md "One sampling pool per worker")."""

    def __init__(
        self,
        watch: HangWatch,
        container,
        sink: SampleSink | None = None,
        pool: SamplingPool | None = None,
        engine: str = "",
        host=None,
    ):
        self.watch, self.container, self.sink = watch, container, sink
        self.engine = engine  # whose turns are counted together (the host's base URL)
        # The container's host: each turn asks through the turning thread's own client of it
        # (bounded), not the follower's that looked the container up (its thread's).
        self.host = host
        self.stopped = threading.Event()
        self.pool = pool if pool is not None else SAMPLING
        self.started = False

    def start(self) -> None:
        if self.started:  # twice in the pool would turn one watch on two threads at once
            raise RuntimeError("a Sampler is started once")
        self.started = True
        self.pool.add(self)

    def turn(self) -> None:
        chart = self.sink is not None and self.sink.due()
        if chart or self.watch.needs_sample():
            try:
                sample = self.watch.sample(self._container_here())
            except EngineError as exc:  # the engine's version, asked once, had no answer
                log.debug("no sample of %s: %s", self.engine, exc)  # the follower hears of its engine
                sample = self.watch.missed()
            if chart:
                try:
                    self.sink.record(sample)
                except Exception:  # a chart's point is never worth the hang watch
                    log.exception("recording a resource sample failed")
        else:
            self.watch.last_cpu_ns = None  # the next sample starts a fresh interval

    def _container_here(self):
        """The container through the turning thread's own client (its first on this engine
        asks the engine's API version: that may raise)."""
        if self.host is None:
            return self.container
        return on_this_thread(self.container, self.host, timeout=SAMPLE_CLIENT_TIMEOUT_S)

    def stop(self) -> None:
        """No more turns after the one under way, if any (it is not waited for, as before)."""
        self.stopped.set()


class SamplingPool:
    """Turns every followed container's Sampler, each `every_s` after its last turn ended, on a
    few threads of the process. A thread per instance (190 of them at 200 instances, each waking
    every 2 s for a call of a few ms) made the worker's threads fight for the interpreter beside
    the followers; a few threads serve the same turns. One clock thread waits for the earliest due
    time (the others would all wake for each) and hands due samplers to the turning threads.

    A turn may wait on an engine that does not answer (bounded: SAMPLE_TIMEOUT_S, STATS_TIMEOUT_S).
    So one engine has at most `threads` turns under way (its other due samplers queue behind
    them, in order, and go out as those end), and the pool starts another thread whenever every thread it
    has is taken, up to `max_threads`: a silent engine holds threads of its own, never the turns
    of the others (with a thread per sampler it held only its own samplers' threads). A thread
    without a turn for `idle_s` leaves while there are more than `threads` and more than the
    turns under way."""

    def __init__(
        self,
        threads: int = SAMPLER_THREADS,
        every_s: float = SAMPLE_EVERY_S,
        tick_s: float = 0.05,
        max_threads: int = SAMPLER_THREADS_MAX,
        idle_s: float = SAMPLER_IDLE_S,
    ):
        self.threads, self.every_s, self.tick_s, self.idle_s = threads, every_s, tick_s, idle_s
        self.max_threads = max(threads, max_threads)
        self._forget()

    def add(self, sampler: Sampler) -> None:
        """Its next turn, `every_s` from now."""
        with self._changed:
            if not self._started:  # lazily: a process that follows nothing has none
                # A clock that cannot start raises to the follower that asked (nothing would turn).
                threading.Thread(target=self._hand_out_forever, name="sampler-clock", daemon=True).start()
                self._started = True
                self._grow(self.threads)
            self._push(time.monotonic() + self.every_s, sampler)

    def waiting(self) -> int:
        """How many samplers wait for a turn (stopped ones leave at their due time)."""
        with self._changed:
            return len(self._due) + sum(len(queued) for queued in self._behind.values())

    def turning_threads(self) -> int:
        with self._changed:
            return self._turners

    def _push(self, when: float, sampler: Sampler) -> None:
        """Under the lock."""
        if not self._due or when < self._due[0][0]:
            self._changed.notify()  # a new earliest: the clock waits for it (only the clock waits)
        heapq.heappush(self._due, (when, next(self._order), sampler))

    def _grow(self, to: int) -> None:
        """Under the lock. A thread that cannot start (the process's limit) is tried again at the
        next hand-out; the clock goes on with the threads there are."""
        while self._turners < min(to, self.max_threads):
            thread = threading.Thread(target=self._turn_forever, name=f"sampler-{self._turners + 1}", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                log.warning("no thread for the samplers' turns: %d turning", self._turners)
                return
            self._turners += 1

    def _hand_out_forever(self) -> None:
        while True:
            with self._changed:
                if not self._due:
                    self._changed.wait()
                    continue
                now = time.monotonic()
                delay = self._due[0][0] - now
                if delay > 0:
                    # Not sooner than a tick: the turns due meanwhile go out together, one
                    # wake-up of this thread for several (a turn every 2 s does not mind 50 ms).
                    self._changed.wait(max(delay, self.tick_s))
                    continue
                due = []
                while self._due and self._due[0][0] <= now:
                    due.append(heapq.heappop(self._due)[2])
                ready = []
                for sampler in due:
                    if sampler.stopped.is_set():
                        continue  # a stopped one leaves here
                    if self._under_way.get(sampler.engine, 0) >= self.threads:
                        # Its engine has enough turns under way: after them (a turn that ends
                        # hands its thread to the next of its engine).
                        self._behind.setdefault(sampler.engine, collections.deque()).append(sampler)
                        continue
                    self._under_way[sampler.engine] = self._under_way.get(sampler.engine, 0) + 1
                    ready.append(sampler)
                self._grow(max(self.threads, sum(self._under_way.values())))
            for sampler in ready:
                self._ready.put(sampler)
            due = ready = sampler = None  # a stopped one's container and chart are not held here

    def _turn_forever(self) -> None:
        counted = True
        try:
            while True:
                try:
                    sampler = self._ready.get(timeout=self.idle_s)
                except queue.Empty:
                    if self._leave_if_spare():
                        counted = False
                        return
                    continue
                try:
                    sampler.turn()
                except Exception:  # nothing ends these threads: without samples no hang is judged
                    log.exception("sampling a container failed")
                finally:  # also when something ends this thread: the sampler and its engine go on
                    self._turned(sampler)
                sampler = None  # not held while this thread waits for the next
        finally:
            if counted:
                with self._changed:
                    self._turners -= 1  # the next hand-out starts another

    def _leave_if_spare(self) -> bool:
        """An idle thread's question: are there more threads than the pool keeps and than the
        turns under way (handed out, queued or turning: each of those keeps a thread)? Then this
        one leaves, counted out under the lock, so a hand-out grows again if it needs it."""
        with self._changed:
            if self._turners > max(self.threads, sum(self._under_way.values())):
                self._turners -= 1
                return True
            return False

    def _turned(self, sampler: Sampler) -> None:
        """Its next turn, and its engine's next sampler that waited behind this turn."""
        with self._changed:
            if not sampler.stopped.is_set():
                self._push(time.monotonic() + self.every_s, sampler)
            following = self._next_behind(sampler.engine)
            if following is None:
                self._under_way[sampler.engine] -= 1
                if not self._under_way[sampler.engine]:
                    del self._under_way[sampler.engine]
        if following is not None:
            self._ready.put(following)  # the engine's count of turns under way stays

    def _next_behind(self, engine: str) -> Sampler | None:
        """Under the lock: the next sampler of `engine` that waits for one of its turns to end."""
        queued = self._behind.get(engine)
        while queued:
            sampler = queued.popleft()
            if not sampler.stopped.is_set():
                return sampler
        self._behind.pop(engine, None)
        return None

    def _forget(self) -> None:
        self._due: list[tuple[float, int, Sampler]] = []  # (when, tie-break, sampler): a heap
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._ready: queue.SimpleQueue[Sampler] = queue.SimpleQueue()
        self._under_way: dict[str, int] = {}  # engine -> turns handed out and not yet ended
        self._behind: dict[str, collections.deque[Sampler]] = {}  # engine -> due, after those
        self._turners = 0
        self._started = False


SAMPLING = SamplingPool()
# A forked child has none of the parent's threads, and none of its followers.
os.register_at_fork(after_in_child=SAMPLING._forget)


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
