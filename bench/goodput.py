#!/usr/bin/env python3
"""Goodput under faults: the demo MLP under one schedule of injected faults, run by the console
and, side by side on the same host, by `docker run --restart on-failure`; prints both effective
training time ratios.

The job: examples/train_checkpoint.py (console/python:3.11), checkpointing every 20 steps of
~55 ms, one CPU and 256 MB each, on a second dockerd (the host that is lost at the end). The
console's job has R = 10, unconditional restart (an OOM is not retryable otherwise, SPEC §4),
hang restart, a 5 s hang window; Docker's container gets the same image, command, user, limits
and a checkpoint folder in its own file system (a Docker restart keeps it).

The schedule (--quick: every 20 s, to 100 s), the same moments for both, injected from outside:
  40 s  SIGKILL of the training process (host PID, from the container's cgroup);
  80 s  OOM: a `docker exec` balloon (uid 1000) raises the trainer's oom_score_adj to 1000 (what
        a process may do to its own user's processes) and allocates until the kernel's memory
        cgroup OOM killer kills the trainer, then exits: a real OOM kill of the training process;
 120 s  hang: SIGSTOP of the training process (Docker never recovers it);
 160 s  lost host: SIGKILL of the second dockerd and its containerd, then of every process of
        its containers (the machine is gone); the console's first host is enabled just before
        (it was disabled so that every earlier restart stayed on the second host);
 240 s  end of the window.

The ratio, the same for both, from the same evidence (Docker's timestamps of the training
process's own log lines: the console's persisted log for its job, the json-file log for Docker's):
the time spent computing the steps the model keeps / the time since the first start (the first
line of the first run) to the end of the window. A run's steps are its progress lines; a step's
time runs from the run's previous line; the kept steps are the lineage of the model at the end
(the last run's steps, back through the checkpoint it resumed from, to step 0). A run that logged
no progress in the last 2 s of the window counts only to its last checkpoint (its later work is
lost: it died, or hangs). Restarts, process start-up and work done again are not progress.

Targets: ours >= 0.95 and strictly above Docker's; exits non-zero when missed (--quick: only
above Docker's). Also prints the console's own status.goodput and recovery records.

    .venv/bin/python bench/goodput.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._docker import SecondEngine, job_own, python_process  # noqa: E402
from bench._stack import BENCH_LABEL, PYTHON_IMAGE, RUN_LABEL, Stack  # noqa: E402
from tests.shared import wait_for  # noqa: E402

SCRIPT = "/opt/console/examples/train_checkpoint.py"
TRAIN = ["--steps", "1000000", "--checkpoint-every", "20", "--sleep", "0.05"]
FLAVOR, CPUS, MEMORY_MB = "bench.1u256m", 1, 256
HANG_WINDOW_S = 5
TARGET = 0.95
LIVE_S = 2.0  # a run that logged progress this close to the window's end is still training
FAULTS = ("sigkill", "oom", "hang", "host")

START_RE = re.compile(r"^\[checkpoint\] (?:resumed from step=(\d+)|no checkpoint, starting from step 0)$")
PROGRESS_RE = re.compile(r"^\[progress\] step=(\d+) ")
SAVED_RE = re.compile(r"^\[checkpoint\] saved step=(\d+)$")

# Runs inside the container as uid 1000: marks the trainer as the OOM killer's victim (raising
# one's own processes' oom_score_adj needs no privilege), then fills the memory cgroup.
BALLOON = r"""
import os, time
me = os.getpid()
def trainer():
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != me:
            try:
                argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if argv[0].split(b"/")[-1].startswith(b"python") and any(b"train_checkpoint" in a for a in argv[1:]):
                return int(p)
pid = trainer()
open(f"/proc/{pid}/oom_score_adj", "w").write("1000")
held = []
for _ in range(256):  # at most 2 GB: never more than the limit needs
    try:
        if open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] in "ZX":
            break
    except OSError:
        break
    held.append(b"\1" * (8 << 20))
    time.sleep(0.01)
"""


# -- the evidence: runs of the training process in a log ----------------------------------------------
@dataclass
class Run:
    start_ns: int
    resume_step: int
    progress: list[tuple[int, int]] = field(default_factory=list)  # (ts_ns, step)
    saved: list[tuple[int, int]] = field(default_factory=list)  # (ts_ns, step): checkpoints

    def until(self, end_ns: int) -> Run:
        return Run(
            self.start_ns,
            self.resume_step,
            [(t, s) for t, s in self.progress if t <= end_ns],
            [(t, s) for t, s in self.saved if t <= end_ns],
        )


def runs_of(lines: list[tuple[int, str]]) -> list[Run]:
    """The training process's runs in a log of (ts_ns, text): each starts at its checkpoint line."""
    runs: list[Run] = []
    for ts, text in sorted(lines, key=lambda line: line[0]):
        if m := START_RE.match(text):
            runs.append(Run(ts, int(m.group(1) or 0)))
        elif (m := PROGRESS_RE.match(text)) and runs:
            runs[-1].progress.append((ts, int(m.group(1))))
        elif (m := SAVED_RE.match(text)) and runs:
            runs[-1].saved.append((ts, int(m.group(1))))
    return runs


@dataclass
class Useful:
    start_ns: int  # the first line of the first run
    end_ns: int
    steps: list[tuple[int, float]]  # the kept steps: (ts_ns, seconds computing it)
    final_step: int
    computed: int  # steps computed in all, done again included

    @property
    def ratio(self) -> float:
        return sum(dt for _, dt in self.steps) / ((self.end_ns - self.start_ns) / 1e9)

    def lost_s(self, a_ns: int, b_ns: int) -> float:
        """Time in [a, b) of the window not spent on kept steps."""
        a_ns, b_ns = max(a_ns, self.start_ns), min(b_ns, self.end_ns)
        return max(0.0, (b_ns - a_ns) / 1e9 - sum(dt for t, dt in self.steps if a_ns <= t < b_ns))


def useful(runs: list[Run], end_ns: int, live_s: float = LIVE_S) -> Useful:
    """The kept steps at end_ns: the last run's (to its last step if it is still training, else to
    its last checkpoint), then those of the run that computed the step it resumed from, and so on."""
    runs = [r.until(end_ns) for r in runs if r.start_ns <= end_ns]
    last = runs[-1]
    if last.progress and last.progress[-1][0] >= end_ns - live_s * 1e9:
        target = last.progress[-1][1]
    else:
        target = max([last.resume_step] + [step for _, step in last.saved])
    final, kept, i = target, [], len(runs) - 1
    while True:
        run = runs[i]
        previous = run.start_ns
        for ts, step in run.progress:
            if run.resume_step < step <= target:
                kept.append((ts, (ts - previous) / 1e9))
            previous = ts
        target = run.resume_step
        # The run that computed the checkpoint this one resumed from: the latest before it that
        # started below that step. Not "the latest whose log shows that step": the run before a
        # lost host saved its checkpoint, and the line of that step died with the engine before
        # anyone read it (Docker's log too), so the walk stopped there and kept only the last run.
        i = next((j for j in range(i - 1, -1, -1) if runs[j].resume_step < target and runs[j].progress), -1)
        if target == 0 or i < 0:
            break
    computed = sum(len(r.progress) for r in runs)
    return Useful(runs[0].start_ns, end_ns, sorted(kept), final, computed)


# -- the two jobs ------------------------------------------------------------------------------------------
def create_ours(stack: Stack) -> str:
    body = {
        "kind": "job",
        "metadata": {
            "name": "bench-goodput",
            "annotations": {
                "fault-tolerance/job-retry-num": "10",
                "fault-tolerance/job-unconditional-retry": "true",
                "fault-tolerance/hang-retry": "true",
            },
        },
        "algorithm": {"command": " ".join(["python3", SCRIPT, *TRAIN]), "engine": {"image_url": PYTHON_IMAGE}},
        "spec": {
            "resource": {"node_count": 1, "flavor_id": FLAVOR},
            "hang_detection": {"window_seconds": HANG_WINDOW_S},
        },
    }
    response = stack.api("POST", "/training-jobs", json=body)
    if response.status_code != 201:
        raise RuntimeError(f"create failed: {response.status_code} {response.text}")
    return response.json()["metadata"]["id"]


def ours_lines(job_id: str) -> list[tuple[int, str]]:
    """The console's persisted log of every attempt (Docker's timestamps)."""
    from jobs.models import TaskRun
    from jobs.runtime.logs import read_lines

    lines = []
    for run in TaskRun.objects.filter(attempt__job_id=job_id).order_by("attempt__number", "index"):
        lines += [(line.ts_ns, line.text) for line in read_lines(run)]
    return lines


def ours_container(engine: SecondEngine, job_id: str):
    return job_own(engine.client().containers.list(filters={"label": f"console.job={job_id}"}))


def start_docker(engine: SecondEngine, tag: str):
    return engine.client().containers.run(
        PYTHON_IMAGE,
        ["python3", SCRIPT, *TRAIN],
        detach=True,
        user="1000:1000",
        environment={"MA_CHECKPOINT_DIR": "/tmp/checkpoints", "PYTHONUNBUFFERED": "1"},
        nano_cpus=int(CPUS * 1e9),
        mem_limit=f"{MEMORY_MB}m",
        memswap_limit=f"{MEMORY_MB}m",
        pids_limit=4096,
        network_mode="none",
        labels={BENCH_LABEL[0]: BENCH_LABEL[1], RUN_LABEL: tag},
        restart_policy={"Name": "on-failure"},
        name=f"bench-goodput-docker-{os.getpid()}",
    )


def docker_lines(engine: SecondEngine, container_id: str) -> list[tuple[int, str]]:
    """Docker's json-file log, read from the lost engine's data root."""
    from jobs.runtime.logs import parse_docker_timestamp

    out = []
    with open(engine.json_log(container_id)) as f:
        for raw in f:
            entry = json.loads(raw)
            out.append((parse_docker_timestamp(entry["time"]), entry["log"].rstrip("\n")))
    return out


def first_progress(lines: list[tuple[int, str]]) -> bool:
    return any(PROGRESS_RE.match(text) for _, text in lines)


# -- the injections --------------------------------------------------------------------------------------
def inject(fault: str, container, engine: SecondEngine | None = None) -> str:
    """One fault into one job's training process; what was done, for the printout."""
    if fault == "host":
        engine.lose()
        return "engine, containerd and container processes SIGKILLed"
    pid = wait_for(lambda: python_process(container.id, SCRIPT), 10, message="the training process", interval=0.1)
    if fault == "sigkill":
        os.kill(pid, signal.SIGKILL)
    elif fault == "hang":
        os.kill(pid, signal.SIGSTOP)
    elif fault == "oom":
        container.exec_run(["python3", "-c", BALLOON], user="1000", detach=True)
    return f"{fault} -> pid {pid} in {container.short_id}"


def _reloaded(container):
    container.reload()  # the same container, restarted in place by Docker: its state now
    return container


def _inject_job(fault: str, container) -> str:
    """A fault into one job, whose container is found by `container()`; "missed: ..." when its
    training process cannot be found (the run is then not a measurement: report() fails it)."""
    import docker

    try:
        found = wait_for(container, 30, message="the job's container", interval=0.1)
        return inject(fault, found)
    except (AssertionError, RuntimeError, docker.errors.APIError) as exc:  # not found in time, or gone
        return f"missed: {exc}"


def schedule(quick: bool) -> tuple[list[tuple[float, str]], float]:
    """(offset, fault) from the moment both train, and the window's end: a fault every 40 s and
    80 s of training after the last (--quick: every 20 s, 20 s after)."""
    every, after = (20.0, 20.0) if quick else (40.0, 80.0)
    faults = [(every * (n + 1), fault) for n, fault in enumerate(FAULTS)]
    return faults, faults[-1][0] + after


def run(stack: Stack, engine: SecondEngine, quick: bool) -> dict:
    from jobs.models import DockerHost, Flavor

    Flavor.objects.create(name=FLAVOR, cpus=CPUS, memory_mb=MEMORY_MB)
    second = DockerHost.objects.create(name="second", base_url=engine.socket)
    # Every restart before the lost host stays on the second host; the first takes over after.
    DockerHost.objects.exclude(id=second.id).update(enabled=False)
    job_id = create_ours(stack)
    wait_for(lambda: first_progress(ours_lines(job_id)), 120, message="the console's job to train", interval=0.2)
    theirs = start_docker(engine, stack.tag)
    wait_for(lambda: first_progress(docker_lines(engine, theirs.id)), 60, message="Docker's job to train", interval=0.2)
    t0 = time.time()
    faults, end_s = schedule(quick)
    done = []
    for offset, fault in faults:
        time.sleep(max(0.0, t0 + offset - time.time()))
        at = time.time()
        if fault == "host":
            DockerHost.objects.exclude(id=second.id).update(enabled=True)
            what = {"both": inject("host", None, engine)}
        else:
            what = {"ours": _inject_job(fault, lambda: ours_container(engine, job_id))}
            what["docker"] = _inject_job(fault, lambda: _reloaded(theirs))
        done.append((offset, fault, at, what))
        print(f"  t={at - t0:6.1f} s  {fault:8s} {what}", flush=True)
    time.sleep(max(0.0, t0 + end_s - time.time()))
    end_ns = int((t0 + end_s) * 1e9)
    status = stack.job(job_id)["status"]
    recoveries = stack.api("GET", f"/training-jobs/{job_id}/recoveries").json()["items"]
    stack.api("POST", f"/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    stack.wait_phase(job_id, {"Terminated", "Failed", "Completed"}, timeout=60)
    return {
        "t0": t0,
        "end_ns": end_ns,
        "faults": done,
        "ours": useful(runs_of(ours_lines(job_id)), end_ns),
        "docker": useful(runs_of(docker_lines(engine, theirs.id)), end_ns),
        "ours_runs": len(runs_of(ours_lines(job_id))),
        "docker_runs": len(runs_of(docker_lines(engine, theirs.id))),
        "status": status,
        "recoveries": recoveries,
    }


def segments(result: dict) -> list[tuple[str, int, int]]:
    """Where the time was lost: before the first fault, around each fault (half the spacing on
    either side: what was done since its last checkpoint, and the recovery), after the last."""
    ours, faults = result["ours"], result["faults"]
    half = int((faults[1][2] - faults[0][2]) / 2 * 1e9)
    at = [int(f[2] * 1e9) for f in faults]
    out = [("before the first fault", ours.start_ns, at[0] - half)]
    out += [
        (f"{fault} (±{half / 1e9:.0f} s)", t - half, t + half) for (_, fault, _, _), t in zip(faults, at, strict=True)
    ]
    return out + [("after the last fault", at[-1] + half, ours.end_ns)]


def report(result: dict, quick: bool, load: tuple[float, float]) -> int:
    ours, theirs = result["ours"], result["docker"]
    print()
    print(
        f"window: {(ours.end_ns - ours.start_ns) / 1e9:.1f} s (console), "
        f"{(theirs.end_ns - theirs.start_ns) / 1e9:.1f} s (Docker), each from its job's first line; "
        f"load average {load[0]:.2f} before, {load[1]:.2f} after; "
        f"{os.cpu_count()} CPUs"
    )
    print()
    print("| | console | docker run --restart on-failure |")
    print("|---|---|---|")
    print(f"| effective training time ratio | **{ours.ratio:.4f}** | **{theirs.ratio:.4f}** |")
    print(
        f"| steps kept at the end / computed | {ours.final_step} / {ours.computed} "
        f"| {theirs.final_step} / {theirs.computed} |"
    )
    for name, a, b in segments(result):
        print(f"| time lost {name} | {ours.lost_s(a, b):.2f} s | {theirs.lost_s(a, b):.2f} s |")
    print(f"| runs of the training process | {result['ours_runs']} | {result['docker_runs']} |")
    print()
    print(f"console's own status.goodput at the end: {json.dumps(result['status'].get('goodput'))}")
    t0 = result["t0"]
    for r in reversed(result["recoveries"]):  # oldest first
        at = datetime.fromisoformat(r["detected_at"]).timestamp() - t0
        print(
            f"  t={at:6.1f} s  {r['failure_class']:14s} {r['level'] or 'end':10s} downtime {r['downtime_s']} s, "
            f"work lost {r['work_lost_s']} s, lost {r['lost_s']} s ({r['decision']})"
        )
    above, target = ours.ratio > theirs.ratio, ours.ratio >= TARGET
    missed = [
        f"{fault}: {w}" for _, fault, _, what in result["faults"] for w in what.values() if w.startswith("missed")
    ]
    if missed:
        print(f"\nNOT A MEASUREMENT: a fault was not injected ({'; '.join(missed)})")
    print()
    print(
        f"target: console >= {TARGET}: {'met' if target else 'missed'}"
        f"{' (not checked with --quick)' if quick else ''}; "
        f"above Docker's: {'met' if above else 'missed'}"
    )
    return 0 if above and (quick or target) and not missed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true", help="a fault every 20 s, 100 s in all")
    parser.add_argument("--database", default=f"console_bench_{os.getpid()}")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    engine = SecondEngine()
    try:
        t = time.monotonic()
        engine.start()
        engine.load_image(PYTHON_IMAGE)
        print(f"second dockerd on {engine.socket}, {PYTHON_IMAGE} loaded ({time.monotonic() - t:.1f} s)")
        with Stack(args.database, keep_db=args.keep_db) as stack:
            result = run(stack, engine, args.quick)
    finally:
        engine.cleanup()
    return report(result, args.quick, (load_before, os.getloadavg()[0]))


if __name__ == "__main__":
    sys.exit(main())
