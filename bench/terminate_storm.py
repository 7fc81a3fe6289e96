#!/usr/bin/env python3
"""Terminate storm: N running fault-tolerant single-instance jobs (their standbys made, and armed
unless CONSOLE_STANDBY_ARMED=0) are all terminated at once; how long until every job is
Terminated and every container gone. A run that does not converge within --timeout-s exits 1
(the engine or the worker wedged: see docs/decisions.md, "Armed").

    .venv/bin/python bench/terminate_storm.py [--jobs 150] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import BUSYBOX, Stack  # noqa: E402
from bench.supervisor_scale import create_job, followed_and_running, wait  # noqa: E402


def storm(stack: Stack, client, n: int, size: int, armed: bool, timeout_s: float) -> bool:
    """One round: `size` jobs running with their standbys, all terminated at once; True when it
    converged (every job ended, every container gone) within timeout_s."""
    from jobs.models import FINAL_PHASES, TrainingJob

    jobs = [create_job(stack, f"storm-{n}-{i:04d}") for i in range(size)]
    wait(lambda: followed_and_running(jobs), 600, f"{len(jobs)} running", 0.5)

    def standbys() -> int:
        listed = client.containers.list(
            all=True, sparse=True, filters={"label": "console.standby=1", "status": "running" if armed else "created"}
        )
        return len({c.attrs.get("Labels", {}).get("console.job") for c in listed} & set(jobs))

    wait(lambda: standbys() == len(jobs), 600, f"{len(jobs)} standbys", 0.5)
    t0 = time.monotonic()
    for job_id in jobs:
        stack.api("POST", f"/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    try:
        ended = wait(
            lambda: not TrainingJob.objects.filter(id__in=jobs).exclude(phase__in=FINAL_PHASES).exists(),
            timeout_s,
            "every job ended",
            0.5,
        )
        gone = wait(
            lambda: not client.containers.list(all=True, sparse=True, filters={"label": "console.bench=1"}),
            timeout_s,
            "every container removed",
            0.5,
        )
    except RuntimeError as exc:
        left = TrainingJob.objects.filter(id__in=jobs).exclude(phase__in=FINAL_PHASES).count()
        print(f"round {n}: DID NOT CONVERGE after {time.monotonic() - t0:.0f} s: {exc}; {left} jobs not ended")
        return False
    print(
        f"round {n}: {len(jobs)} jobs ({'armed' if armed else 'made'} standbys): every job ended {ended:.1f} s "
        f"after the storm began, every container gone {ended + gone:.1f} s after",
        flush=True,
    )
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--database", default=f"console_bench_storm_{os.getpid()}")
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    client.images.get(BUSYBOX)
    armed = os.environ.get("CONSOLE_STANDBY_ARMED", "1") != "0"
    with Stack(args.database) as stack:
        for n in range(args.rounds):
            if not storm(stack, client, n, args.jobs, armed, args.timeout_s):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
