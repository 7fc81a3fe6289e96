#!/usr/bin/env python3
"""The engine alone: how a bare `docker stop` grows with the number of running containers when no
console runs at all. The baseline for supervisor_scale's question of whose growth a stop's is.

At each size it runs that many busybox tickers (supervisor_scale's job command: a line a second,
network none, the local log driver) and then measures `docker stop` of a probe container exactly as
supervisor_scale's baseline does. Options add, one at a time, what the console adds beside its
instances:

    --standbys   one more running container per ticker, waiting as an armed standby waits (a read
                 with a 5 s timeout, no output): the console keeps one per fault-tolerant
                 single-instance job (jobs/runtime/standby.py), so 200 instances are 400 containers
    --follow     every ticker's log followed, as the console's followers do
    --stats      a stats reading of every ticker every 10 s, as the resource charts ask

    .venv/bin/python bench/engine_alone.py [--sizes 10,200] [--probes 40] [--standbys] [--follow] [--stats]

Not a benchmark with a target: a measurement for bench/README.md. Needs only Docker and the
console/busybox image (scripts/setup.sh). Its containers carry the label console.bench.run=engine-alone
and are removed at the end.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import BUSYBOX, percentile  # noqa: E402
from bench.supervisor_scale import BARE_TICKER, bare_stop_latency, run_bare  # noqa: E402

RUN_TAG = "engine-alone"  # the label console.bench.run of its containers
# What an armed standby's launcher does until its go (faulttolerance/launcher.sh step 1): a read on
# its wake FIFO with a 5 s timeout, again and again. Here a read on a FIFO nobody writes.
STANDBY_WAIT = "trap 'exit 0' TERM; mkfifo /tmp/wake; exec 3<>/tmp/wake; while :; do read -t 5 -u 3 x; done"


def follow(api, container_id: str) -> None:
    try:
        for _ in api.logs(container_id, stream=True, follow=True, timestamps=True):
            pass
    except Exception:  # the container went at the end: the stream with it
        pass


def sample_stats(api, tickers: list, done: threading.Event) -> None:
    """Every ticker's stats once every 10 s, spread over the 10 s (one-shot, as the console asks)."""
    while not done.is_set():
        began = time.monotonic()
        for container in list(tickers):
            try:
                url = api._url("/containers/{0}/stats", container.id)
                api._result(api._get(url, params={"stream": False, "one-shot": True}, timeout=5), json=True)
            except Exception:
                pass
            done.wait(max(0.0, 10.0 / max(1, len(tickers)) - 0.002))
        done.wait(max(0.0, 10 - (time.monotonic() - began)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,200")
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument("--standbys", action="store_true")
    parser.add_argument("--follow", action="store_true")
    parser.add_argument("--stats", action="store_true")
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    client.images.get(BUSYBOX)
    tickers: list = []
    done = threading.Event()
    if args.stats:
        threading.Thread(
            target=sample_stats, args=(docker.APIClient(version="auto"), tickers, done), daemon=True
        ).start()
    rows = []
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            while len(tickers) < size:
                tickers.append(run_bare(client, BARE_TICKER, RUN_TAG))
                if args.standbys:
                    run_bare(client, STANDBY_WAIT, RUN_TAG)
                if args.follow:
                    threading.Thread(target=follow, args=(client.api, tickers[-1].id), daemon=True).start()
            time.sleep(5)  # the last ones started and ticking
            stops = sorted(bare_stop_latency(client, RUN_TAG) for _ in range(args.probes))
            running = len(client.containers.list(sparse=True, filters={"label": f"console.bench.run={RUN_TAG}"}))
            rows.append((size, running, percentile(stops, 50), percentile(stops, 95)))
            print(
                f"{size} tickers ({running} containers running): bare stop p50 {rows[-1][2] * 1000:.0f} ms, "
                f"p95 {rows[-1][3] * 1000:.0f} ms",
                flush=True,
            )
    finally:
        done.set()
        for container in client.containers.list(all=True, filters={"label": f"console.bench.run={RUN_TAG}"}):
            container.remove(force=True)
    added = ", ".join(name for name in ("standbys", "follow", "stats") if getattr(args, name)) or "nothing"
    first, last = rows[0], rows[-1]
    print(
        f"\nthe engine alone ({added} beside the tickers): a bare `docker stop` p50 {last[2] / first[2]:.2f}x, "
        f"p95 {last[3] / first[3]:.2f}x at {last[0]} tickers against {first[0]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
