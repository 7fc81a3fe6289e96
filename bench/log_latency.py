#!/usr/bin/env python3
"""Log latency: from the moment a line is written in a job's container to its
arrival at a websocket client of the job page, against `docker logs -f`.

Runs the production stack (PostgreSQL + Redis + a separate Celery worker and
daphne; see bench/_stack.py). A training job in the python image prints
`lat <n> <time.time_ns()>` every ~10 ms (1000 lines by default) after a short
warm-up; the script follows the same container with a websocket client on
/ws/jobs/<id>/logs/0/ (logged in through the login page, like a browser) and
with a `docker logs -f` subprocess at the same time, so both see the very same
lines. Latency = arrival time at the client - the time the line carries (one
kernel clock: the container and this script share it).

Target: the websocket's p99 is no more than 50 ms above docker logs -f's p99.

    .venv/bin/python bench/log_latency.py [--lines 1000] [--interval-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import PYTHON_IMAGE, Stack, parse_lines, percentile  # noqa: E402

TARGET_P99_EXTRA_MS = 50.0


def job_command(lines: int, interval_ms: float, warmup_s: float) -> str:
    code = (
        "import time\n"
        f"for i in range(1, {lines + 1}):\n"
        '    print("lat", i, time.time_ns(), flush=True)\n'
        f"    time.sleep({interval_ms / 1000!r})\n"
    )
    # The warm-up lets both readers attach before the first line.
    return f"sleep {warmup_s}; python3 -u -c '{code}'"


def parse_payload(text: str) -> tuple[int, int] | None:
    parts = text.split()
    if len(parts) == 3 and parts[0] == "lat":
        return int(parts[1]), int(parts[2])
    return None


class DockerLogsFollower(threading.Thread):
    """`docker logs -f --timestamps <container>` in a subprocess; notes when each line arrives."""

    def __init__(self, container_id: str, expected: int):
        super().__init__(daemon=True, name="docker-logs-f")
        self.container_id, self.expected = container_id, expected
        self.arrivals: dict[int, tuple[int, int, int]] = {}  # n -> (written ns, arrival ns, docker ts ns)
        self.done = threading.Event()
        self.proc: subprocess.Popen | None = None

    def run(self) -> None:
        from jobs.runtime.logs import parse_docker_timestamp

        self.proc = subprocess.Popen(
            ["docker", "logs", "-f", "--timestamps", self.container_id], stdout=subprocess.PIPE, bufsize=0
        )
        stdout = self.proc.stdout
        assert stdout is not None
        buffer = b""
        while len(self.arrivals) < self.expected:
            chunk = stdout.read1(65536) if hasattr(stdout, "read1") else stdout.read(65536)
            arrival = time.time_ns()
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                ts, _, text = raw.decode().partition(" ")
                parsed = parse_payload(text)
                if parsed:
                    self.arrivals[parsed[0]] = (parsed[1], arrival, parse_docker_timestamp(ts))
        self.done.set()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)


async def follow_websocket(url: str, cookie: str, origin: str, expected: int, ready: asyncio.Event, timeout: float):
    """Collects (n, written ns, arrival ns) for each line pushed to the log socket."""
    import websockets
    import websockets.exceptions

    closed = ""
    arrivals: dict[int, tuple[int, int]] = {}
    order: list[int] = []
    raw: list[tuple[int, str]] = []
    async with websockets.connect(
        url, additional_headers={"Cookie": cookie, "Origin": origin}, max_size=None, compression=None
    ) as ws:
        ready.set()
        opened = time.monotonic()
        deadline = opened + timeout
        while len(arrivals) < expected:
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
            raw.append((time.time_ns(), message))
            for _n, text in parse_lines(message):
                parsed = parse_payload(text)
                if parsed and parsed[0] not in arrivals:
                    arrivals[parsed[0]] = (parsed[1], raw[-1][0])
                if parsed:
                    order.append(parsed[0])
    return arrivals, order, closed


def summarize(name: str, latencies_ms: list[float]) -> dict[str, float]:
    values = sorted(latencies_ms)
    stats = {
        "count": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": values[-1] if values else float("nan"),
    }
    print(
        f"  {name:<38} n={stats['count']:>5}  p50={stats['p50']:8.2f}  p90={stats['p90']:8.2f}  "
        f"p99={stats['p99']:8.2f}  max={stats['max']:8.2f} ms"
    )
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    # Time for the readers to attach before the first line; a quiet socket may wait any length
    # (bench/quiet_socket.py).
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--database", default=f"console_bench_{os.getpid()}")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    client.images.get(PYTHON_IMAGE)  # fails early when the image is missing

    with Stack(args.database, keep_db=args.keep_db) as stack:
        cookie = stack.session_cookie()
        command = job_command(args.lines, args.interval_ms, args.warmup_s)
        job_id = stack.create_job("bench-latency", PYTHON_IMAGE, command)
        created = time.monotonic()
        run_timeout = args.warmup_s + args.lines * args.interval_ms / 1000 * 3 + 60

        async def run() -> tuple:
            # Attach both readers once the container exists, during its warm-up.
            container = await stack.job_container(job_id)
            attach_s = time.monotonic() - created
            ready = asyncio.Event()
            ws_task = asyncio.create_task(
                follow_websocket(
                    stack.ws_url(f"/ws/jobs/{job_id}/logs/0/"), cookie, stack.url, args.lines, ready, run_timeout
                )
            )
            await asyncio.wait_for(ready.wait(), 30)
            follower = DockerLogsFollower(container.id, args.lines)
            follower.start()
            result = await ws_task
            await asyncio.to_thread(follower.done.wait, 30)
            follower.stop()
            return result, follower, attach_s

        (ws_arrivals, ws_order, ws_closed), follower, attach_s = asyncio.run(run())
        if attach_s >= args.warmup_s:
            print(f"warning: the readers attached {attach_s:.2f} s after submission: the warm-up may be over")
        phase = stack.wait_phase(job_id, {"Completed", "Failed", "Terminated"}, timeout=60)

        # Docker's own receive time of each line, from the console's persisted log.
        log_files = list(Path(stack.tmp, "logs", job_id).glob("attempt-1-worker-0.log"))
        docker_ts: dict[int, int] = {}
        if log_files:
            for raw_line in log_files[0].read_text().splitlines():
                ts, _, text = raw_line.partition(" ")
                parsed = parse_payload(text)
                if parsed:
                    docker_ts[parsed[0]] = int(ts)

    print(f"\njob {job_id}: {phase}; {args.lines} lines, one every {args.interval_ms:g} ms")
    missing_ws = sorted(set(range(1, args.lines + 1)) - set(ws_arrivals))
    missing_dl = sorted(set(range(1, args.lines + 1)) - set(follower.arrivals))
    duplicates = len(ws_order) - len(set(ws_order))
    in_order = ws_order == sorted(ws_order)
    print(
        f"websocket: {len(ws_arrivals)} lines, {len(missing_ws)} missing, {duplicates} duplicated, "
        f"{'in order' if in_order else 'OUT OF ORDER'}; docker logs -f: {len(follower.arrivals)} lines, "
        f"{len(missing_dl)} missing"
    )
    if ws_closed:
        print(f"websocket {ws_closed}")

    print("\nlatency, write -> arrival at the reader:")
    ws_lat = [(arrival - written) / 1e6 for written, arrival in ws_arrivals.values()]
    dl_lat = [(arrival - written) / 1e6 for written, arrival, _ts in follower.arrivals.values()]
    ws = summarize("websocket /ws/jobs/<id>/logs/0/", ws_lat)
    dl = summarize("docker logs -f", dl_lat)

    print("\nwhere the time goes (docker ts = when the engine read the line from the container):")
    summarize("write -> docker ts", [(ts - w) / 1e6 for w, _a, ts in follower.arrivals.values()])
    summarize("docker ts -> docker logs -f", [(a - ts) / 1e6 for _w, a, ts in follower.arrivals.values()])
    summarize(
        "docker ts -> websocket",
        [(ws_arrivals[n][1] - docker_ts[n]) / 1e6 for n in ws_arrivals if n in docker_ts],
    )
    paired = [(ws_arrivals[n][1] - follower.arrivals[n][1]) / 1e6 for n in ws_arrivals if n in follower.arrivals]
    summarize("websocket - docker logs -f (per line)", paired)

    extra = ws["p99"] - dl["p99"]
    ok = extra <= TARGET_P99_EXTRA_MS and not missing_ws and duplicates == 0 and in_order
    print(
        f"\np99 websocket {ws['p99']:.2f} ms - p99 docker logs -f {dl['p99']:.2f} ms = {extra:+.2f} ms "
        f"(target: <= {TARGET_P99_EXTRA_MS:.0f} ms, every line once and in order) -> {'MET' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
