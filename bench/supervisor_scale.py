#!/usr/bin/env python3
"""Supervisor scale: 10, 50, 100 and 200 running instances (busybox, one line a second
each) on ONE worker process. At each size: the worker's CPU, RSS and threads; Stop ->
Terminated and failure -> restarted latencies (p50/p95); at the end, every line of every
run persisted once, in order.

Targets (issue "One supervisor that scales"): 200 instances on one worker; the latencies
at 200 within 2x of those at 10; memory per instance reported. Exits non-zero when one
is missed.

Runs the production stack (PostgreSQL + Redis + a separate Celery worker and daphne;
bench/_stack.py). Each instance is one single-instance job with fault tolerance on.

    .venv/bin/python bench/supervisor_scale.py [--sizes 10,50,100,200] [--probes 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import BUSYBOX, Stack, percentile  # noqa: E402
from bench._trace import enable_docker_trace  # noqa: E402

TICKER = 'i=0; while true; do i=$((i+1)); echo "tick $i"; sleep 1; done'
CLK_TCK = os.sysconf("SC_CLK_TCK")


def create_job(stack: Stack, name: str) -> str:
    body = {
        "kind": "job",
        "metadata": {"name": name, "annotations": {"fault-tolerance/job-retry-num": "10"}},
        "algorithm": {"command": TICKER, "engine": {"image_url": BUSYBOX}},
        "spec": {"resource": {"node_count": 1}},
    }
    response = stack.api("POST", "/training-jobs", json=body)
    if response.status_code != 201:
        raise RuntimeError(f"create failed: {response.status_code} {response.text}")
    return response.json()["metadata"]["id"]


def worker_pid(stack: Stack) -> int:
    return next(proc.pid for name, proc in stack.procs if name == "celery-worker")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def machine_ticks() -> tuple[int, int]:
    """(idle, total) jiffies of every CPU of the machine since boot (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait


def status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


def followed_and_running(job_ids: list[str]) -> bool:
    from django.utils import timezone

    from jobs.models import Phase, TaskRun, TrainingJob

    running = TrainingJob.objects.filter(id__in=job_ids, phase=Phase.RUNNING).count()
    fresh = timezone.now() - timezone.timedelta(seconds=6)
    followed = TaskRun.objects.filter(
        attempt__job_id__in=job_ids, state=TaskRun.State.RUNNING, follower_heartbeat__gt=fresh
    ).count()
    return running == len(job_ids) and followed == len(job_ids)


def standbys_made(client, job_ids: list[str]) -> bool:
    """Every job has its next container made and armed (jobs/runtime/standby.py): the steady
    state of a fault-tolerant job, which a restart then only gives its go. The next attempt's:
    a standby taken over by a restart keeps its label, and the one after it is made later."""
    from django.db.models import Max

    from jobs.models import Attempt, TrainingJob
    from jobs.runtime.docker_hosts import container_name

    rows = Attempt.objects.filter(job_id__in=job_ids).values("job_id").annotate(n=Max("number"))
    latest = {str(row["job_id"]): row["n"] for row in rows}
    made = client.containers.list(all=True, sparse=True, filters={"label": "console.standby=1", "status": "running"})
    names = {(c.attrs.get("Names") or ["/"])[0].lstrip("/") for c in made}
    return all(
        container_name(TrainingJob(id=uuid.UUID(job_id)), latest.get(job_id, 0) + 1, 0) in names for job_id in job_ids
    )


def wait(predicate, timeout: float, what: str, interval: float = 0.02) -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(interval)
    return time.monotonic() - t0


def stop_latency(stack: Stack, job_id: str) -> float:
    from jobs.models import Phase, TrainingJob

    t0 = time.monotonic()
    POSTED[job_id] = time.time()
    response = stack.api("POST", f"/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    response.raise_for_status()
    wait(
        lambda: TrainingJob.objects.filter(id=job_id, phase=Phase.TERMINATED).exists(),
        120,
        f"job {job_id} Terminated",
    )
    return time.monotonic() - t0


def settled_stop(stack: Stack, client, job_id: str) -> float:
    """A stop, timed; then every container of the job gone before the next probe (its own and its
    armed standby: a kill and a removal each, engine work that would otherwise fall into the next
    probe's stop: stops are measured one at a time, each on a settled engine, as the restarts are)."""
    latency = stop_latency(stack, job_id)
    wait(
        lambda: not client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job_id}"}),
        60,
        f"job {job_id}'s containers removed",
    )
    return latency


POSTED: dict[str, float] = {}  # job id -> wall time of its Stop's POST


def stop_breakdown(trace_path: Path, job_ids: list[str]) -> dict[str, list[float]]:
    """Where each stop's time went (ms), from the database's timestamps, the engine's FinishedAt
    and the worker's traced Docker calls: the request, the worker's stop call, the container's
    exit, the job's end."""
    from jobs.models import TaskRun, TrainingJob

    calls = []
    looks = []  # (start, end, thread, path) of the worker's inspects: the stop's own look-up
    if trace_path.exists():
        for line in trace_path.read_text().splitlines():
            parts = line.split(" ", 5)
            if len(parts) == 6 and parts[4] == "POST" and "/stop" in parts[5]:
                calls.append((int(parts[0]) / 1e9, int(parts[1]) / 1e9, parts[5], parts[3]))
            elif len(parts) == 6 and parts[4] == "GET" and parts[5].split("?")[0].endswith("/json"):
                looks.append((int(parts[0]) / 1e9, int(parts[1]) / 1e9, parts[3]))
    out: dict[str, list[float]] = {}
    for job_id in job_ids:
        job = TrainingJob.objects.get(id=job_id)
        run = TaskRun.objects.filter(attempt__job_id=job_id, ended_at__isnull=False).order_by("-ended_at").first()
        stop = next((c for c in calls if run and run.container_id and run.container_id in c[2]), None)
        if run is None or stop is None or job.ended_at is None:
            continue
        requested = job.terminate_requested_at.timestamp()
        # The stop task's calls before its stop (same thread, after the request): the look-ups.
        before = [c for c in looks if c[2] == stop[3] and requested <= c[0] and c[1] <= stop[0]]
        first_call = min((c[0] for c in before), default=stop[0])
        marks = [
            ("request", POSTED[job_id], requested),
            ("queued -> first engine call", requested, first_call),
            ("look-ups before the stop", first_call, stop[0]),
            ("stop call -> exit", stop[0], run.ended_at.timestamp()),
            ("exit -> stop call returned", run.ended_at.timestamp(), stop[1]),
            ("stop returned -> Terminated", stop[1], job.ended_at.timestamp()),
        ]
        for what, a, b in marks:
            out.setdefault(what, []).append((b - a) * 1000)
    return out


def restart_latency(client, job_id: str) -> float:
    """SIGKILL the job's container from outside: time until the next attempt's container runs."""
    from jobs.models import TaskRun

    run = TaskRun.objects.select_related("attempt").get(
        attempt__job_id=job_id, state=TaskRun.State.RUNNING, attempt__state="running"
    )
    number = run.attempt.number
    container = client.containers.get(run.container_id)
    t0 = time.monotonic()
    killed_at = time.time()
    container.kill()
    KILLED[job_id] = (killed_at, time.time(), number)
    wait(
        lambda: TaskRun.objects.filter(
            attempt__job_id=job_id, attempt__number__gt=number, state=TaskRun.State.RUNNING
        ).exists(),
        120,
        f"job {job_id} restarted",
    )
    SEEN[job_id] = time.time()
    return time.monotonic() - t0


def pool_waits(path: Path, start: float, end: float) -> list[float]:
    """The worker's waits for a pooled database connection (over 2 ms) that began in the window, ms."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and start <= int(parts[0]) / 1e9 <= end:
                out.append((int(parts[1]) - int(parts[0])) / 1e6)
    return out


KILLED: dict[str, tuple[float, float, int]] = {}  # job id -> wall times around the kill, the attempt
SEEN: dict[str, float] = {}  # job id -> wall time the bench saw the next attempt's run running


def restart_breakdown(trace_path: Path, job_ids: list[str]) -> dict[str, list[float]]:
    """Where each restart's time went (ms), from the engine's FinishedAt, the database's timestamps
    and the worker's traced Docker calls: the kill, the follower's look at the ended container and
    its last read of the log, the decision, the look-up of the armed standby, the take-over."""
    from jobs.models import Attempt, TaskRun

    calls = []  # (start, end, path) of the worker's container calls
    if trace_path.exists():
        for line in trace_path.read_text().splitlines():
            parts = line.split(" ", 5)
            if len(parts) == 6 and "/containers/" in parts[5]:
                calls.append((int(parts[0]) / 1e9, int(parts[1]) / 1e9, parts[5].split("?")[0]))
    out: dict[str, list[float]] = {}
    for job_id in job_ids:
        if job_id not in KILLED or job_id not in SEEN:
            continue
        killed_at, kill_returned, number = KILLED[job_id]
        dead = TaskRun.objects.filter(attempt__job_id=job_id, attempt__number=number, index=0).first()
        ended = Attempt.objects.filter(job_id=job_id, number=number).first()
        nxt = (
            TaskRun.objects.select_related("attempt").filter(attempt__job_id=job_id, attempt__number=number + 1).first()
        )
        known = dead and dead.container_id and dead.ended_at and ended and ended.ended_at
        if not (known and nxt and nxt.attempt.started_at):
            continue
        exit_at = dead.ended_at.timestamp()
        on_dead = [c for c in calls if dead.container_id in c[2] and c[0] >= exit_at - 0.05]
        looked = min((c[0] for c in on_dead), default=None)
        last_read = max((c[1] for c in on_dead if c[1] <= ended.ended_at.timestamp()), default=None)
        lookup = next(
            (c for c in calls if c[2].endswith(f"/containers/{nxt.container_name}/json") and c[0] >= exit_at), None
        )
        if looked is None or last_read is None or lookup is None:
            continue
        marks = [
            ("kill call", killed_at, kill_returned),
            ("kill returned -> exit", kill_returned, exit_at),
            ("exit -> follower's look", exit_at, looked),
            ("look + last read of the log", looked, last_read),
            ("-> attempt decided", last_read, ended.ended_at.timestamp()),
            ("decided -> standby looked up", ended.ended_at.timestamp(), lookup[0]),
            ("standby look-up", lookup[0], lookup[1]),
            ("take-over -> running", lookup[1], nxt.attempt.started_at.timestamp()),
            ("running -> seen", nxt.attempt.started_at.timestamp(), SEEN[job_id]),
        ]
        for what, a, b in marks:
            out.setdefault(what, []).append((b - a) * 1000)
    return out


BARE_TICKER = "trap 'exit 0' TERM; " + TICKER.replace("sleep 1", "sleep 1 & wait $!")


def bare_stop_latency(client, stack: Stack) -> float:
    """The baseline, on the same engine under the same load: `docker stop` of a bare container
    running the same ticker (no console: the engine's own share of a stop at this size). It exits
    on SIGTERM as a job's launcher does; one instance's spec, networking disabled."""
    container = client.containers.run(
        BUSYBOX,
        ["sh", "-c", BARE_TICKER],
        detach=True,
        network_mode="none",
        network_disabled=True,
        log_config={"type": "local"},
        labels={"console.bench": "1", "console.bench.run": stack.tag},
    )
    try:
        time.sleep(1.5)  # a few ticks: it runs as the jobs' containers do
        t0 = time.monotonic()
        container.stop(timeout=10)
        return time.monotonic() - t0
    finally:
        container.remove(force=True)


def worker_troubles(stack: Stack) -> dict[str, int]:
    """What went wrong in the worker, from its log: followers that failed (and were adopted
    again), database connections not had within the pool's timeout, tasks that raised."""
    text = Path(stack.tmp, "celery-worker.log").read_text(errors="replace")
    return {
        "followers failed": text.count("it will be adopted again"),
        "pool timeouts": text.count("couldn't get a connection"),  # psycopg_pool's message
        "tasks raised": text.count("raised unexpected"),
    }


def check_lines() -> tuple[int, int, list[str]]:
    """Every run's persisted ticks are 1..k, once each, in order (a run may be cut short)."""
    from jobs.models import TaskRun
    from jobs.runtime.logs import read_lines

    runs = lines = 0
    problems = []
    for run in TaskRun.objects.select_related("attempt").exclude(log_lines=0):
        ticks = [int(t.split()[1]) for t in (line.text for line in read_lines(run)) if t.startswith("tick ")]
        runs += 1
        lines += len(ticks)
        if ticks != list(range(1, len(ticks) + 1)):
            problems.append(f"{run.container_name}: {ticks[:5]}... ({len(ticks)} ticks, not 1..k)")
    return runs, lines, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,50,100,200")
    parser.add_argument("--probes", type=int, default=10, help="stops and kills measured at each size")
    parser.add_argument("--settle-s", type=float, default=10, help="CPU is measured over this window")
    parser.add_argument("--database", default=f"console_bench_scale_{os.getpid()}")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--trace-copy", help="copy the worker's traced Docker calls here before the stack goes")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    import docker

    client = docker.from_env()
    client.images.get(BUSYBOX)
    rows = []
    stack = Stack(args.database, keep_db=args.keep_db)
    trace_path = enable_docker_trace(stack)
    os.environ["BENCH_STOP_TRACE"] = os.path.join(stack.tmp, "stop-trace.log")
    pool_trace = Path(stack.tmp, "pool-trace.log")
    os.environ["BENCH_POOL_TRACE"] = str(pool_trace)
    with stack:
        pid = worker_pid(stack)
        time.sleep(2)
        idle = status(pid)
        running: list[str] = []
        made = 0
        for size in sizes:
            # The size's instances, plus the probes that are stopped (the kills restart in place).
            while len(running) < size + args.probes:
                made += 1
                running.append(create_job(stack, f"scale-{made:04d}"))
            up = wait(lambda: followed_and_running(running), 600, f"{len(running)} instances running", 0.5)
            # Measured in the steady state: every instance's standby made (their creates are
            # housekeeping work that a long run does once, right after it starts).
            standby_s = 0.0
            if os.environ.get("CONSOLE_STANDBY_CONTAINERS", "1") != "0":
                standby_s = wait(lambda: standbys_made(client, running), 600, f"{len(running)} standbys", 0.5)
            time.sleep(2)
            cpu0, t0, (idle0, total0) = cpu_seconds(pid), time.monotonic(), machine_ticks()
            time.sleep(args.settle_s)
            cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
            idle1, total1 = machine_ticks()
            machine_idle = 100 * (idle1 - idle0) / max(1, total1 - total0)
            now = status(pid)
            window = (time.time(), None)
            kills = [restart_latency(client, job_id) for job_id in running[: args.probes]]
            window = (window[0], time.time())
            if os.environ.get("CONSOLE_STANDBY_CONTAINERS", "1") != "0":
                # The restarted jobs' next standbys are made STANDBY_AFTER_S later: the stops are
                # measured once they are there again (with 20 probes, their creates fell into the
                # stops' window and doubled the stop p50 at 200).
                wait(lambda: standbys_made(client, running), 120, "the restarted jobs' standbys", 0.5)
            stop_window = (time.time(), None)
            stops = [settled_stop(stack, client, job_id) for job_id in running[-args.probes :]]
            stop_window = (stop_window[0], time.time())
            bare = sorted(bare_stop_latency(client, stack) for _ in range(args.probes))
            parts = stop_breakdown(trace_path, running[-args.probes :])
            restart_parts = restart_breakdown(trace_path, running[: args.probes])
            del running[-args.probes :]
            rss_per = (now["VmRSS"] - idle["VmRSS"]) / 1024 / len(running)
            rows.append(
                {
                    "size": len(running),
                    "up_s": up,
                    "standby_s": standby_s,
                    "cpu": cpu * 100,
                    "machine_idle": machine_idle,
                    "rss_mb": now["VmRSS"] / 1024,
                    "rss_per_mb": rss_per,
                    "threads": now["Threads"],
                    "stop": sorted(stops),
                    "bare_stop": bare,
                    "restart": sorted(kills),
                    "stop_parts": parts,
                    "restart_parts": restart_parts,
                    "pool_waits": pool_waits(pool_trace, *window),
                    "stop_pool_waits": pool_waits(pool_trace, *stop_window),
                }
            )
            r = rows[-1]
            print(
                f"{r['size']:>4} instances: all followed {up:5.1f} s after the last submit, their standbys "
                f"{r['standby_s']:5.1f} s later; worker CPU "
                f"{r['cpu']:5.1f}% of a core (the machine {r['machine_idle']:.0f}% idle), "
                f"RSS {r['rss_mb']:6.1f} MB ({r['rss_per_mb']:.2f} MB per instance), "
                f"{r['threads']} threads; stop p95 {percentile(r['stop'], 95) * 1000:.0f} ms, "
                f"restart p95 {percentile(r['restart'], 95) * 1000:.0f} ms; a bare `docker stop` "
                f"p95 {percentile(r['bare_stop'], 95) * 1000:.0f} ms",
                flush=True,
            )
            for what, values in parts.items():
                print(f"      stop: {what:<30} " + " ".join(f"{v:6.0f}" for v in values) + " ms", flush=True)
            for during, waits in (("restarts", r["pool_waits"]), ("stops", r["stop_pool_waits"])):
                print(
                    f"      waits for a pooled database connection over 2 ms during the {during}: "
                    f"{len(waits)} ({sum(waits):.0f} ms in all, the longest {max(waits, default=0):.0f} ms)",
                    flush=True,
                )
            for what, values in restart_parts.items():
                print(f"      restart: {what:<30} " + " ".join(f"{v:6.0f}" for v in values) + " ms", flush=True)
        for job_id in running:
            stack.api("POST", f"/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
        from jobs.models import FINAL_PHASES, TrainingJob

        wait(lambda: not TrainingJob.objects.exclude(phase__in=FINAL_PHASES).exists(), 600, "every job ended", 0.5)
        time.sleep(3)  # the followers drain and let go
        runs, lines, problems = check_lines()
        troubles = worker_troubles(stack)
        if args.trace_copy:
            shutil.copyfile(trace_path, args.trace_copy)
            if pool_trace.exists():
                shutil.copyfile(pool_trace, args.trace_copy + ".pool")

    print(f"\nDocker {client.version()['Version']}, {os.cpu_count()} CPUs, one worker process; ms")
    print(
        f"  {'instances':>9} {'idle %':>6} {'CPU %':>6} {'RSS MB':>7} {'MB/inst':>7} {'threads':>7}  "
        f"{'stop p50':>8} {'p95':>6}  {'restart p50':>11} {'p95':>6}  {'bare stop p50':>13} {'p95':>6}"
    )
    for r in rows:
        print(
            f"  {r['size']:>9} {r['machine_idle']:>6.0f} {r['cpu']:>6.1f} {r['rss_mb']:>7.1f} "
            f"{r['rss_per_mb']:>7.2f} {r['threads']:>7}  "
            f"{percentile(r['stop'], 50) * 1000:>8.0f} {percentile(r['stop'], 95) * 1000:>6.0f}  "
            f"{percentile(r['restart'], 50) * 1000:>11.0f} {percentile(r['restart'], 95) * 1000:>6.0f}  "
            f"{percentile(r['bare_stop'], 50) * 1000:>13.0f} {percentile(r['bare_stop'], 95) * 1000:>6.0f}"
        )
    first, last = rows[0], rows[-1]
    checks = {
        f"{last['size']} instances followed by one worker": last["size"] >= sizes[-1],
        "stop p95 at the largest size within 2x of the smallest": percentile(last["stop"], 95)
        <= 2 * percentile(first["stop"], 95),
        "restart p95 at the largest size within 2x of the smallest": percentile(last["restart"], 95)
        <= 2 * percentile(first["restart"], 95),
        f"every line persisted once, in order ({lines} lines of {runs} runs)": not problems,
        "nothing failed in the worker (" + ", ".join(f"{what}: {n}" for what, n in troubles.items()) + ")": not any(
            troubles.values()
        ),
    }
    bare_ratio = percentile(last["bare_stop"], 95) / percentile(first["bare_stop"], 95)
    print(
        f"\n  the baseline: a bare `docker stop` on the same engine, p95 {last['size']} vs {first['size']}: "
        f"{bare_ratio:.2f}x (the console's stop: "
        f"{percentile(last['stop'], 95) / percentile(first['stop'], 95):.2f}x)"
    )
    print()
    for what, ok in checks.items():
        print(f"  {'met ' if ok else 'MISSED'} {what}")
    for problem in problems[:10]:
        print(f"    {problem}")
    ok = all(checks.values())
    print(f"\n-> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
