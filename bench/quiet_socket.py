#!/usr/bin/env python3
"""Quiet socket: a job page left open on a job that prints nothing for 10 minutes still
shows the next line the moment it comes.

Runs the production stack (PostgreSQL + Redis + a separate Celery worker and daphne; see
bench/_stack.py). A job in the python image prints one line, stays silent for --silence-s
(600 by default), then prints `lat <n> <time.time_ns()>` for --lines lines, 0.1 s apart.
The script holds both sockets of the job page open all along, as a browser does (logged in
through the login page): the job socket /ws/jobs/<id>/ and the log socket
/ws/jobs/<id>/logs/0/, and follows the container with `docker logs -f` too. It reports
whether the sockets stayed open, whether the lines after the silence arrived on the same log
socket (each once, in order), and the latency of the first one (arrival - the time it
carries), beside `docker logs -f`'s for the same line.

Pass: both sockets open throughout, every line after the silence on the log socket, the
first one at most 50 ms later than `docker logs -f` saw it (the log latency target), and the
job's end on the job socket. Exit status 0 on PASS.

    .venv/bin/python bench/quiet_socket.py [--silence-s 600] [--lines 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import PYTHON_IMAGE, Stack, parse_lines  # noqa: E402
from bench.log_latency import TARGET_P99_EXTRA_MS, DockerLogsFollower, parse_payload  # noqa: E402


def job_command(silence_s: float, lines: int) -> str:
    code = (
        "import time\n"
        'print("quiet from now on", flush=True)\n'
        f"time.sleep({silence_s!r})\n"
        f"for i in range(1, {lines + 1}):\n"
        '    print("lat", i, time.time_ns(), flush=True)\n'
        "    time.sleep(0.1)\n"
    )
    return f"python3 -u -c '{code}'"


class Watch:
    """One socket of the page: every message with its arrival time (ns), and how it ended."""

    def __init__(self, name: str, url: str, cookie: str, origin: str):
        self.name, self.url, self.cookie, self.origin = name, url, cookie, origin
        self.messages: list[tuple[int, str]] = []
        self.closed = ""  # how the server ended it, if it did
        self.opened = asyncio.Event()
        self.changed = asyncio.Event()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        import websockets
        import websockets.exceptions

        async with websockets.connect(
            self.url, additional_headers={"Cookie": self.cookie, "Origin": self.origin}, max_size=None
        ) as ws:
            self.opened.set()
            opened = time.monotonic()
            stop = asyncio.ensure_future(self.stop.wait())
            try:
                while not self.stop.is_set():
                    receive = asyncio.ensure_future(ws.recv())
                    await asyncio.wait([receive, stop], return_when=asyncio.FIRST_COMPLETED)
                    if not receive.done():
                        receive.cancel()
                        break
                    try:
                        message = receive.result()
                    except websockets.exceptions.ConnectionClosed as exc:
                        self.closed = f"closed by the server after {time.monotonic() - opened:.1f} s: {exc}"
                        break
                    self.messages.append((time.time_ns(), message))
                    self.changed.set()
            finally:
                stop.cancel()
                self.changed.set()

    def longest_quiet_s(self, since_ns: int, until_ns: int) -> float:
        """The longest time without a message on this socket between two instants."""
        times = [since_ns] + [t for t, _ in self.messages if since_ns < t < until_ns] + [until_ns]
        return max(b - a for a, b in zip(times, times[1:], strict=False)) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--silence-s", type=float, default=600.0)
    parser.add_argument("--lines", type=int, default=5, help="lines printed after the silence")
    parser.add_argument("--database", default=f"console_bench_{os.getpid()}")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()

    import docker

    docker.from_env().images.get(PYTHON_IMAGE)  # fails early when the image is missing

    with Stack(args.database, keep_db=args.keep_db) as stack:
        cookie = stack.session_cookie()
        job_id = stack.create_job("bench-quiet", PYTHON_IMAGE, job_command(args.silence_s, args.lines))

        async def run():
            container = await stack.job_container(job_id)
            job_ws = Watch("job", stack.ws_url(f"/ws/jobs/{job_id}/"), cookie, stack.url)
            log_ws = Watch("log", stack.ws_url(f"/ws/jobs/{job_id}/logs/0/"), cookie, stack.url)
            tasks = [asyncio.create_task(w.run()) for w in (job_ws, log_ws)]
            await asyncio.wait_for(asyncio.gather(job_ws.opened.wait(), log_ws.opened.wait()), 30)
            follower = DockerLogsFollower(container.id, args.lines)
            follower.start()
            attached_ns = time.time_ns()
            print(f"job {job_id}: both sockets open; the job is silent for {args.silence_s:g} s")

            def lat_lines() -> dict[int, tuple[int, int]]:
                """n -> (written ns, arrival ns) of each lat line on the log socket, the first time it came."""
                seen: dict[int, tuple[int, int]] = {}
                for arrival, message in log_ws.messages:
                    for _n, text in parse_lines(message):
                        parsed = parse_payload(text)
                        if parsed and parsed[0] not in seen:
                            seen[parsed[0]] = (parsed[1], arrival)
                return seen

            async def until(watch: Watch, done, timeout: float, every_s: float = 60) -> bool:
                """Wait until done() or the socket closes; a word on both sockets every every_s."""
                deadline = time.monotonic() + timeout
                next_report = time.monotonic() + every_s
                while True:
                    watch.changed.clear()
                    if done() or watch.closed or time.monotonic() > deadline:
                        return done()
                    try:
                        await asyncio.wait_for(watch.changed.wait(), 5)
                    except TimeoutError:
                        pass
                    if time.monotonic() >= next_report:
                        next_report += every_s
                        print(
                            f"  {(time.time_ns() - attached_ns) / 1e9:5.0f} s: "
                            + ", ".join(f"{w.name} socket {'closed' if w.closed else 'open'}" for w in (job_ws, log_ws))
                        )

            await until(log_ws, lambda: len(lat_lines()) >= args.lines, args.silence_s + 120)
            completed = await until(job_ws, lambda: any('data-phase="Completed"' in m for _, m in job_ws.messages), 60)
            await asyncio.to_thread(follower.done.wait, 10)
            follower.stop()
            for watch in (job_ws, log_ws):
                watch.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            return job_ws, log_ws, follower, lat_lines(), attached_ns, completed

        job_ws, log_ws, follower, arrivals, attached_ns, completed_seen = asyncio.run(run())
        phase = stack.wait_phase(job_id, {"Completed", "Failed", "Terminated"}, timeout=60)

    print(f"\njob {job_id}: {phase}; silent for {args.silence_s:g} s, then {args.lines} lines 0.1 s apart")
    ok = phase == "Completed"
    for watch in (job_ws, log_ws):
        if watch.closed:
            print(f"  {watch.name} socket {watch.closed}")
            ok = False
    order = [parsed[0] for _t, m in log_ws.messages for _n, text in parse_lines(m) if (parsed := parse_payload(text))]
    once_in_order = order == list(range(1, args.lines + 1))
    print(
        f"  log socket: {len(arrivals)}/{args.lines} lines after the silence"
        f"{', each once, in order' if once_in_order else ' (MISSING, DUPLICATED OR OUT OF ORDER: ' + str(order) + ')'}"
    )
    ok = ok and once_in_order
    if 1 in arrivals:
        written, arrival = arrivals[1]
        ws_ms = (arrival - written) / 1e6
        docker_arrival = follower.arrivals.get(1, (None, None, None))[1]
        quiet_log = log_ws.longest_quiet_s(attached_ns, arrival)
        quiet_job = job_ws.longest_quiet_s(attached_ns, arrival)
        print(f"  sockets quiet before the line: log {quiet_log:.1f} s, job {quiet_job:.1f} s (longest gaps)")
        line = f"  first line after the silence: websocket {ws_ms:.1f} ms after it was written"
        if docker_arrival is not None:
            dl_ms = (docker_arrival - written) / 1e6
            extra = ws_ms - dl_ms
            line += f", docker logs -f {dl_ms:.1f} ms ({extra:+.1f} ms; target <= {TARGET_P99_EXTRA_MS:.0f} ms)"
            ok = ok and extra <= TARGET_P99_EXTRA_MS
        else:
            line += " (docker logs -f did not see it)"
            ok = False
        print(line)
    else:
        print("  the first line after the silence did not arrive on the log socket")
        ok = False
    print(f"  job socket: {'showed Completed' if completed_seen else 'did NOT show Completed'}")
    ok = ok and completed_seen
    print(f"\n-> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
