#!/usr/bin/env python3
"""No lost lines: a job prints 100,000 numbered lines as fast as it can; the
persisted log (API `GET .../tasks/worker-0/logs`) must hold every line exactly
once, in order. The live websocket stream (/ws/jobs/<id>/logs/0/, connected
before the first line) sends at most 2,000 lines a second in a burst and says
how many it did not show ("N lines not shown"): its lines must be in order,
once each, end with the last line, and with the counts not shown add up to
every line.

Runs the production stack (PostgreSQL + Redis + a separate Celery worker and
daphne; see bench/_stack.py).

    .venv/bin/python bench/no_lost_lines.py [--lines 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import PYTHON_IMAGE, Stack, parse_lines  # noqa: E402


def job_command(lines: int, warmup_s: float) -> str:
    # One process writing as fast as it can (block-buffered stdout, no flush per line).
    code = f'import sys; sys.stdout.writelines("line %d\\n" % i for i in range(1, {lines + 1}))'
    return f"sleep {warmup_s}; python3 -c '{code}'"


def check(name: str, got: list[str], expected: list[str]) -> bool:
    if got == expected:
        print(f"  {name:<28} {len(got):>7} lines: all present, once each, in order")
        return True
    seen = set(got)
    missing = [line for line in expected if line not in seen]
    duplicates = len(got) - len(seen)
    first_diff = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
    print(
        f"  {name:<28} {len(got):>7} lines: {len(missing)} missing (first: {missing[:3]}), "
        f"{duplicates} duplicated, first difference at index {first_diff}"
    )
    return False


async def follow_websocket(url: str, cookie: str, origin: str, expected: int, ready: asyncio.Event, timeout: float):
    import websockets
    import websockets.exceptions

    closed = ""
    not_shown = 0
    numbers: list[int] = []
    texts: list[str] = []
    distinct: set[int] = set()
    first_at = last_at = None
    messages = 0
    async with websockets.connect(
        url, additional_headers={"Cookie": cookie, "Origin": origin}, max_size=None, compression=None
    ) as ws:
        ready.set()
        opened = time.monotonic()
        deadline = opened + timeout
        while len(distinct) < expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                message = await asyncio.wait_for(ws.recv(), remaining)
            except TimeoutError:
                break
            except websockets.exceptions.ConnectionClosed as exc:
                closed = f"closed by the server after {time.monotonic() - opened:.2f} s: {exc}"
                break
            messages += 1
            not_shown += sum(int(n.replace(",", "")) for n in re.findall(r"([\d,]+) lines? not shown", message))
            lines = parse_lines(message)
            if lines:
                last_at = time.monotonic()
                first_at = first_at or last_at
            for n, text in lines:
                numbers.append(n)
                texts.append(text)
                distinct.add(n)
            if texts and texts[-1] == f"line {expected}":
                break
    return numbers, texts, messages, first_at, last_at, closed, not_shown


class Timeline(threading.Thread):
    """Samples the acknowledged (persisted) line count of the job's task run."""

    def __init__(self, job_id: str, t0: float):
        super().__init__(daemon=True, name="timeline")
        self.job_id, self.t0 = job_id, t0
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()
        self.start()

    def run(self) -> None:
        from django.db import connection

        from jobs.models import TaskRun

        while not self.stopped.wait(0.5):
            lines = TaskRun.objects.filter(attempt__job_id=self.job_id).values_list("log_lines", flat=True).first()
            self.samples.append((time.monotonic() - self.t0, lines or 0))
        connection.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)

    def print(self) -> None:
        print("\npersisted lines over time (s: lines):")
        row = [f"{t:5.1f}: {n:>6}" for t, n in self.samples]
        for i in range(0, len(row), 6):
            print("  " + "   ".join(row[i : i + 6]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=100_000)
    # Time for the readers to attach before the first line; a quiet socket may wait any length
    # (bench/quiet_socket.py).
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--database", default=f"console_bench_{os.getpid()}")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--timeline", action="store_true", help="print the persisted line count every 0.5 s")
    args = parser.parse_args()
    expected = [f"line {i}" for i in range(1, args.lines + 1)]

    import docker

    docker.from_env().images.get(PYTHON_IMAGE)

    with Stack(args.database, keep_db=args.keep_db) as stack:
        cookie = stack.session_cookie()
        job_id = stack.create_job("bench-lines", PYTHON_IMAGE, job_command(args.lines, args.warmup_s))
        submitted = time.monotonic()
        timeline = Timeline(job_id, submitted) if args.timeline else None

        async def run():
            # Connect once the container exists, during its warm-up: before the first line.
            await stack.job_container(job_id)
            ready = asyncio.Event()
            task = asyncio.create_task(
                follow_websocket(
                    stack.ws_url(f"/ws/jobs/{job_id}/logs/0/"), cookie, stack.url, args.lines, ready, args.timeout_s
                )
            )
            await asyncio.wait_for(ready.wait(), 30)
            return await task

        numbers, texts, messages, ws_first, ws_last, ws_closed, not_shown = asyncio.run(run())
        phase = stack.wait_phase(job_id, {"Completed", "Failed", "Terminated"}, timeout=args.timeout_s)
        completed = time.monotonic()
        t0 = time.monotonic()
        response = stack.api("GET", f"/training-jobs/{job_id}/tasks/worker-0/logs")
        response.raise_for_status()
        persisted = response.text.splitlines()
        fetch_s = time.monotonic() - t0
        job = stack.job(job_id)
        if timeline:
            timeline.stop()

    print(f"\njob {job_id}: {phase} ({job['status']['reason'] or 'no reason'})")
    print(f"{args.lines} lines written after a {args.warmup_s:g} s warm-up:")
    ok_persisted = check("persisted log (API)", persisted, expected)
    shown = [int(t.split()[1]) for t in texts if t.startswith("line ")]
    ok_ws = (
        shown == sorted(set(shown)) and bool(shown) and shown[-1] == args.lines and len(shown) + not_shown == args.lines
    )
    print(
        f"  {'websocket stream':<28} {len(shown):>7} lines shown + {not_shown} counted as not shown: "
        + ("in order, once each, ending with the last line, adding up" if ok_ws else "WRONG")
    )
    if ws_closed:
        print(f"  websocket {ws_closed}")
    ok_numbers = numbers == sorted(set(numbers))
    if not ok_numbers:
        print("  websocket line numbers (data-n) are not increasing")
    print("\ntimes (from the job's submission):")
    if ws_first is not None:
        print(
            f"  websocket: first line at {ws_first - submitted:6.2f} s, last at {ws_last - submitted:6.2f} s "
            f"({ws_last - ws_first:.2f} s for {len(texts)} lines in {messages} messages, "
            f"{len(texts) / max(ws_last - ws_first, 1e-9):,.0f} lines/s)"
        )
    print(f"  job Completed seen at {completed - submitted:6.2f} s; persisted log fetched in {fetch_s:.2f} s")
    ok = phase == "Completed" and ok_persisted and ok_ws and ok_numbers
    if timeline:
        timeline.print()
    print(f"\n-> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
