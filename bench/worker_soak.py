#!/usr/bin/env python3
"""Worker soak: does one worker's memory grow with the runs it has followed?

Short jobs (busybox, ten lines, exit 0) are kept `--in-flight` at a time on the production stack
(bench/_stack.py: PostgreSQL, Redis, one Celery worker, daphne) until `--runs` have ended. After
every `--every` runs the worker is looked at idle (every run ended, its follower gone): its RSS
threads and open sockets from /proc, and its Python heap. A worker lives for weeks and
follows thousands of runs: what one run leaves behind adds up.

The worker's Python heap is counted from inside: the benchmark puts bench/_heap/sitecustomize.py
on the worker's PYTHONPATH (not the console's code), which answers each sample with the blocks
Python's allocator holds and the objects the garbage collector tracks, by type.

Target (ours: supervisor_scale showed the worker's RSS growing with the runs it had followed,
not only with those it follows now): every job completed, and the idle Python heap does not grow
with the runs: its blocks at the end within 1 % of those at the middle. A leak (a cache keyed by run,
an object graph, a thread or a connection kept per run) grows alike in both halves; RSS is
reported beside it (the allocator keeps freed memory). Exits non-zero when missed.

    .venv/bin/python bench/worker_soak.py [--runs 1500] [--in-flight 20] [--every 250]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import BUSYBOX, Stack, verdict  # noqa: E402
from tests.shared import wait_for  # noqa: E402

COMMAND = "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; done"
MB = 2**20
# A look's keys besides the counts of objects by type.
NOT_KINDS = {"runs", "s", "rss", "threads", "sockets", "blocks", "objects", "malloc_in_use", "malloc_free"}
HEAP_HOOK = Path(__file__).resolve().parent / "_heap"


def worker_memory(pid: int) -> tuple[float, int, int]:
    """(RSS in MB, threads, open sockets) of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    sockets = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            sockets += os.readlink(fd).startswith("socket:")
        except OSError:  # closed since the listing
            continue
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"]), sockets


def heap(folder: Path, n: int) -> dict[str, int]:
    """The worker's Python heap now, as bench/_heap/sitecustomize.py answers: "blocks", "objects"
    and the count of each type of object."""
    (folder / f"ask-{n}").touch()
    answer = folder / f"heap-{n}"
    deadline = time.monotonic() + 60
    while not answer.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not answer for its heap (is bench/_heap on its PYTHONPATH?)")
        time.sleep(0.1)
    counts = {}
    for line in answer.read_text().splitlines():
        if line.startswith("# "):
            print(f"      {line[2:]}")  # a traced line of code's growth (--trace-python)
            continue
        first, _, second = line.partition(" ")
        if first in ("blocks", "objects", "malloc_in_use", "malloc_free"):
            counts[first] = int(second)
        else:
            counts[second] = int(first)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--in-flight", type=int, default=20)
    parser.add_argument("--every", type=int, default=250, help="runs between two looks at the idle worker")
    parser.add_argument(
        "--trace-python", action="store_true", help="print the worker's code lines whose allocations grew (slower)"
    )
    parser.add_argument(
        "--native",
        metavar="FILE",
        help="record the worker's allocations (C libraries' too, with memray) from the second look to the fourth",
    )
    parser.add_argument("--database", default=f"console_bench_soak_{os.getpid()}")
    args = parser.parse_args()

    stack = Stack(args.database)
    asks = Path(stack.tmp, "heap")
    asks.mkdir()
    # The worker's only: the hook answers in a process whose program is celery.
    os.environ["BENCH_HEAP_DIR"] = str(asks)
    os.environ["BENCH_HEAP_TRACE"] = "1" if args.trace_python else "0"
    if args.native:
        os.environ["BENCH_HEAP_NATIVE"] = str(Path(args.native).resolve())
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HEAP_HOOK), os.environ.get("PYTHONPATH")]))
    samples: list[dict] = []
    with stack:
        from jobs.models import FINAL_PHASES, Phase, TaskRun, TrainingJob

        pid = next(proc.pid for name, proc in stack.procs if name == "celery-worker")
        began, made = time.monotonic(), 0
        ended = TrainingJob.objects.filter(phase__in=FINAL_PHASES)
        followed = TaskRun.objects.filter(follower_token__isnull=False)
        while True:
            # Looked at idle (every run ended, its follower gone): what a run leaves is all that is
            # left, not what the runs in flight hold at that moment.
            wait_for(lambda n=made: ended.count() == n, 120, 0.5, f"{made} runs ended")
            wait_for(lambda: not followed.exists(), 60, 0.5, "every follower gone")
            time.sleep(3)  # their threads' last steps: the clear-up after the release
            rss, threads, sockets = worker_memory(pid)
            counts = heap(asks, len(samples))
            look = {"runs": made, "s": time.monotonic() - began, "rss": rss, "threads": threads, "sockets": sockets}
            samples.append(look | counts)
            print(
                f"{made:6d} runs ended {look['s']:6.0f} s  RSS {rss:6.1f} MB  threads {threads:3d}  "
                f"sockets {sockets:4d}  "
                f"Python heap {counts['blocks']:8d} blocks, {counts['objects']:6d} objects  "
                f"malloc {counts['malloc_in_use'] / MB:6.1f} MB in use, {counts['malloc_free'] / MB:6.1f} MB free",
                flush=True,
            )
            if made >= args.runs:
                break
            target = min(args.runs, made + args.every)
            while made < target:
                live = TrainingJob.objects.exclude(phase__in=FINAL_PHASES).count()
                while live < args.in_flight and made < target:
                    made += 1
                    live += 1
                    stack.create_job(f"soak-{made:05d}", BUSYBOX, COMMAND)
                time.sleep(0.5)
        not_completed = TrainingJob.objects.exclude(phase=Phase.COMPLETED).count()

    # From the look after the first --every runs (the worker's start-up and the first use of
    # each path are not a run's) to the middle look, and from there to the last.
    start, end = samples[1], samples[-1]
    middle = min(samples[1:], key=lambda s: abs(s["runs"] - (start["runs"] + end["runs"]) / 2))

    def per_run(key: str, a: dict, b: dict, scale: float = 1.0) -> float:
        return (b[key] - a[key]) * scale / max(1, b["runs"] - a["runs"])

    print(f"\nidle, after {start['runs']}, {middle['runs']} and {end['runs']} runs ({args.in_flight} at a time):")
    print(
        f"  threads {start['threads']}, {middle['threads']}, {end['threads']}; open sockets "
        f"{start['sockets']}, {middle['sockets']}, {end['sockets']}"
    )
    print(
        f"  Python heap {start['blocks']}, {middle['blocks']}, {end['blocks']} blocks "
        f"({per_run('blocks', start, middle):+.1f} and {per_run('blocks', middle, end):+.1f} a run); "
        f"objects {start['objects']}, {middle['objects']}, {end['objects']}"
    )
    print(
        f"  RSS {samples[0]['rss']:.1f} MB at first, then {start['rss']:.1f}, {middle['rss']:.1f}, {end['rss']:.1f} MB "
        f"({per_run('rss', start, middle, 1024):+.1f} and {per_run('rss', middle, end, 1024):+.1f} KB a run)"
    )
    print(
        f"  malloc in use {start['malloc_in_use'] / MB:.1f}, {middle['malloc_in_use'] / MB:.1f}, "
        f"{end['malloc_in_use'] / MB:.1f} MB; held free {start['malloc_free'] / MB:.1f}, "
        f"{middle['malloc_free'] / MB:.1f}, {end['malloc_free'] / MB:.1f} MB"
    )
    kinds = [k for k in end if k not in NOT_KINDS]
    grown = sorted(kinds, key=lambda k: middle.get(k, 0) - end[k])[:8]
    most = ", ".join(f"{k} {end[k] - middle.get(k, 0):+d}" for k in grown)
    print(f"  objects that grew most over the second half: {most}")
    heap_growth = (end["blocks"] - middle["blocks"]) / middle["blocks"]
    checks = {
        f"every job completed ({not_completed} did not)": not_completed == 0,
        f"the idle Python heap does not grow with the runs: {heap_growth:+.2%} over the second half (<= 1 %)": (
            heap_growth <= 0.01
        ),
    }
    return verdict(checks)


if __name__ == "__main__":
    sys.exit(main())
