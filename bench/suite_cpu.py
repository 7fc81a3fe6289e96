"""Where the test suite's CPU goes: run pytest (the arguments given, as test.sh would) while every
process's CPU time is sampled from /proc, then print it by kind of process, by test file and by test.

    .venv/bin/python -m bench.suite_cpu -n 4 --dist loadfile          # the whole suite, as test.sh runs it
    .venv/bin/python -m bench.suite_cpu -n 1 tests/test_browser.py    # one file

Not a benchmark with a target: a profile (bench/README.md has what it found).

On 2 CPUs the suite is CPU-bound (four sessions keep the CPUs ~90 % busy), so its time is its CPU
time over two: this says what to make cheaper. A process is charged to the test session it descends
from (its Celery worker, daphne, Chromium and the driver, the processes a test starts) and, within
the session, to the test running when it was sampled (module and session fixtures are charged to the
test that set them up or tore them down; collection and the session's start and end to "(between
tests)"). What no session owns (dockerd, containerd, the containers, PostgreSQL, Redis) is shared.
Sampled every SAMPLE_S: a process that lives shorter than that is missed (a container's short
commands), and a test's share is right to about SAMPLE_S either side.
"""

from __future__ import annotations

import bisect
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_S = 0.5
HZ = os.sysconf("SC_CLK_TCK")
TIMELINE = "SUITE_CPU_TIMELINE"  # the file the pytest plugin below writes each test's start and end to
SESSION_MARK = "exec(eval(sys.stdin"  # an xdist session's command line (execnet's bootstrap)


# -- the pytest plugin (loaded into each session with -p bench.suite_cpu) ---------------------------------------------
def _mark(kind: str, nodeid: str) -> None:
    path = os.environ.get(TIMELINE)
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.3f}\t{os.getpid()}\t{kind}\t{nodeid}\n")


def pytest_runtest_logstart(nodeid, location) -> None:
    _mark("start", nodeid)


def pytest_runtest_logfinish(nodeid, location) -> None:
    _mark("end", nodeid)


# -- the sampler -----------------------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, CPU ticks so far, start time) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kind(pid: int, cmd: str) -> str:
    try:
        in_container = "/docker" in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        in_container = False
    if in_container:
        return "container"
    for word, kind in [
        ("chromium", "chromium"),
        ("playwright", "playwright driver"),
        ("celery", "celery worker"),
        ("daphne", "daphne"),
        (SESSION_MARK, "pytest session"),
        ("bin/pytest", "pytest controller"),  # xdist's: collects, hands out tests, reports
        ("manage.py", "manage.py"),
    ]:
        if word in cmd:
            return kind
    return cmd.split(" ", 1)[0].rsplit("/", 1)[-1][:24] or "kernel"


def _session_of(pid: int) -> int:
    """The xdist session a process descends from (its pid), or 0."""
    for _ in range(32):
        if SESSION_MARK in _cmdline(pid):
            return pid
        stat = _stat(pid)
        if stat is None or stat[0] <= 1:
            return 0
        pid = stat[0]
    return 0


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples: list[tuple[float, int, str, int]] = []  # (when, session pid, kind, ticks since)
        # (pid, start time) -> (session, kind, ticks): a pid the kernel gives again is another process
        self._seen: dict[tuple[int, int], tuple[int, str, int]] = {}

    def run(self) -> None:
        first = True
        while not self.stop.is_set():
            now = time.time()
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                pid = int(name)
                if pid == os.getpid():
                    continue  # the sampler's own CPU is not the suite's
                stat = _stat(pid)
                if stat is None:
                    continue
                key = (pid, stat[2])
                if key not in self._seen:  # a process seen the first time: all of its CPU is new
                    self._seen[key] = (_session_of(pid), _kind(pid, _cmdline(pid)), stat[1] if first else 0)
                session, kind, before = self._seen[key]
                if stat[1] > before:
                    self.samples.append((now, session, kind, stat[1] - before))
                    self._seen[key] = (session, kind, stat[1])
            first = False
            self.stop.wait(SAMPLE_S)


def spans_of(timeline: str) -> dict[int, list[tuple[float, float, str]]]:
    """Each session's tests in the order they ran: (start, end, test id), from the plugin's lines."""
    spans, started = collections.defaultdict(list), {}
    for line in timeline.splitlines():
        when, pid, kind, nodeid = line.split("\t", 3)
        if kind == "start":
            started[int(pid)] = (float(when), nodeid)
        elif int(pid) in started:
            begun, nodeid = started.pop(int(pid))
            spans[int(pid)].append((begun, float(when), nodeid))
    return spans


@dataclass
class Charged:
    """CPU seconds by test, by test file and by kind of process (the sessions'), and shared."""

    by_test: dict[str, collections.Counter] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    by_file: dict[str, collections.Counter] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    by_kind: collections.Counter = field(default_factory=collections.Counter)
    shared: collections.Counter = field(default_factory=collections.Counter)


def charge(samples: list[tuple[float, int, str, int]], spans: dict[int, list[tuple[float, float, str]]]) -> Charged:
    """Each sample to the test its session ran when it was taken (or to "(between tests)"); the
    samples of processes no session owns to `shared`."""
    charged = Charged()
    starts = {pid: [span[0] for span in rows] for pid, rows in spans.items()}
    for when, session, kind, ticks in samples:
        seconds = ticks / HZ
        if session not in spans:
            charged.shared[kind] += seconds
            continue
        charged.by_kind[kind] += seconds
        i = bisect.bisect_right(starts[session], when) - 1
        # A sample covers the SAMPLE_S before it: it is the test's if the test ran then.
        running = i >= 0 and spans[session][i][0] <= when <= spans[session][i][1] + SAMPLE_S
        test = spans[session][i][2] if running else "(between tests)"
        charged.by_test[test][kind] += seconds
        charged.by_file[test.split("::")[0]][kind] += seconds
    return charged


def _totals(title: str, seconds: collections.Counter, top: int) -> None:
    print(f"\n{title}")
    for name, total in seconds.most_common(top):
        print(f"{total:8.1f} s  {name}")


def _table(title: str, rows: dict[str, collections.Counter], top: int) -> None:
    """Each row's total and its largest kinds of process."""
    print(f"\n{title}")
    for name, kinds in sorted(rows.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        detail = "  ".join(f"{kind} {s:.0f}" for kind, s in kinds.most_common(4))
        print(f"{sum(kinds.values()):8.1f} s  {name[:100]}  ({detail})")


def _cpu_ticks() -> list[int]:
    """The machine's CPU time so far by state (user, nice, system, idle, iowait, ...), in ticks."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def main(pytest_args: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        timeline = Path(tmp) / "timeline.tsv"
        timeline.touch()
        env = {**os.environ, TIMELINE: str(timeline)}
        # As test.sh runs the suite: its databases, and bytecode caches on.
        env.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/console")
        env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cpu_before = _cpu_ticks()
        sampler = Sampler()
        sampler.start()
        began = time.time()
        rc = subprocess.call([str(root / ".venv/bin/pytest"), "-p", "bench.suite_cpu", *pytest_args], cwd=root, env=env)
        wall = time.time() - began
        sampler.stop.set()
        sampler.join()
        cpu_after = _cpu_ticks()
        charged = charge(sampler.samples, spans_of(timeline.read_text()))

    delta = [b - a for a, b in zip(cpu_before, cpu_after, strict=True)]
    busy = (sum(delta) - delta[3] - delta[4]) / HZ
    print(f"\npytest exited {rc} after {wall:.0f} s; the CPUs were busy {busy:.0f} s of {sum(delta) / HZ:.0f} s")
    print(f"sessions' own processes {sum(charged.by_kind.values()):.0f} s, shared {sum(charged.shared.values()):.0f} s")
    _totals("By kind, in the sessions", charged.by_kind, 20)
    _totals("Shared (no session's)", charged.shared, 10)
    _table("By test file", charged.by_file, 30)
    _table("By test", charged.by_test, 30)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
