#!/usr/bin/env python3
"""Restart latency: how long a job is down when the console restarts it, against
Docker itself, measured in the same run on the same engine.

(a) bare start: `start` of a stopped busybox container (the API call; the CLI for reference),
    sampled up front and again between the console's restarts (same load); the baseline is all of them.
(b) Docker's restart policy on-failure (MaximumRetryCount 6) for a container that exits 1 at
    once: from each death (`die` event) to the next `start` event, retries 1..6.
(c) the console's container restart: a job with fault tolerance (R = 6) whose container is
    SIGKILLed from outside; from the `die` event to the restarted job's first line in its new
    container (Docker's log timestamp): the job is down until then. The next attempt's
    container was made and started (armed, jobs/runtime/standby.py) while the job ran, so no
    `start` event falls in that window; where one does (a container made or started by the
    restart itself), die -> `start` is shown too. Retry n is the n-th kill of a job (SPEC §4
    escalation alternates container and job level when kills follow each other; on one host
    both take the same standby).
(d) the console's process-level restart: a job whose process prints "NCCL timeout" and exits 1
    (transient: restarted in the same container); from the process's last line to the first
    line of the restarted process (Docker's log timestamps).

Runs the production stack (PostgreSQL + Redis + a separate Celery worker and daphne; see
bench/_stack.py). All times come from one clock: Docker's event and log timestamps and the
worker's database timestamps (same kernel).

Targets (the issue "One supervisor that scales"): container level (death -> the job's first line
again) within 1.15x of the bare start; process level within 50 ms; every console retry (death ->
first line) faster than Docker's policy at the same retry (death -> `start`).
Exit status 0 when met.

    .venv/bin/python bench/restart_latency.py [--bare 20] [--policy-runs 3] [--jobs 3] [--process-jobs 7]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._docker import (  # noqa: E402
    LABELS,
    BareStart,
    Events,
    first_line,
    lines_once,
    poll,
    running_container,
)
from bench._stack import BENCH_LABEL, BUSYBOX, Stack  # noqa: E402
from bench._trace import enable_docker_trace, median, ms, read_trace, trace_breakdown  # noqa: E402

RETRIES = 6
CONTAINER_TARGET_RATIO = 1.15  # the issue "One supervisor that scales"
PROCESS_TARGET_MS = 50


def dt_ns(value) -> int:
    """An aware datetime from the database as ns since the epoch."""
    return int(value.timestamp() * 1e9) if value is not None else 0


# -- (b) Docker's restart policy -------------------------------------------------------------------
def policy_done(events: Events, container_id: str) -> bool:
    if events.select_id("destroy", container_id):
        raise RuntimeError(
            f"container {container_id[:12]} was removed from outside: another run's cleanup of the "
            f"{'='.join(BENCH_LABEL)} containers? Run the benchmarks one at a time."
        )
    return len(events.select_id("die", container_id)) >= RETRIES + 1


def docker_policy(client, events: Events, runs: int) -> dict[int, list[float]]:
    """retry n -> die(n-1) -> start(n) in ms, one value per run; also start -> start under key -n."""
    gaps: dict[int, list[float]] = {n: [] for n in range(1, RETRIES + 1)}
    starts_gaps: dict[int, list[float]] = {n: [] for n in range(1, RETRIES + 1)}
    for run in range(runs):
        container = client.containers.run(
            BUSYBOX,
            ["sh", "-c", "exit 1"],
            detach=True,
            labels=LABELS,
            network_mode="none",
            name=f"bench-policy-{os.getpid()}-{run}",
            restart_policy={"Name": "on-failure", "MaximumRetryCount": RETRIES},
        )
        try:
            container_id = container.id
            events.wait(
                partial(policy_done, events, container_id),
                timeout=60,
                what="Docker's restart policy to give up",
            )
            starts = [e["timeNano"] for e in events.select_id("start", container.id)]
            dies = [e["timeNano"] for e in events.select_id("die", container.id)]
            container.reload()
            assert container.attrs["RestartCount"] == RETRIES, container.attrs["RestartCount"]
            for n in range(1, RETRIES + 1):
                gaps[n].append(ms(starts[n] - dies[n - 1]))
                starts_gaps[n].append(ms(starts[n] - starts[n - 1]))
        finally:
            container.remove(force=True)
    return {"die_to_start": gaps, "start_to_start": starts_gaps}


# -- (c) and (d): the console --------------------------------------------------------------------------
def create_job(stack: Stack, name: str, command: str, retries: int) -> str:
    body = {
        "kind": "job",
        "metadata": {"name": name, "annotations": {"fault-tolerance/job-retry-num": str(retries)}},
        "algorithm": {"command": command, "engine": {"image_url": BUSYBOX}},
        "spec": {"resource": {"node_count": 1}},
    }
    response = stack.api("POST", "/training-jobs", json=body)
    if response.status_code != 201:
        raise RuntimeError(f"create failed: {response.status_code} {response.text}")
    return response.json()["metadata"]["id"]


def terminate(stack: Stack, job_id: str) -> None:
    stack.api("POST", f"/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    stack.wait_phase(job_id, {"Terminated", "Failed", "Completed"}, timeout=60)


def wait_attempt_running(client, job_id: str, n: int) -> tuple[object, int]:
    """Attempt n's container, once its user process has printed its first line and a follower
    reads it; returns the container and the time of that line."""
    from jobs.models import TaskRun

    container = poll(lambda: running_container(client, job_id, n), 30, f"attempt {n}'s container")
    marker = f"attempt {n} user process"
    lines = lines_once(container, lambda t: t == marker, f"attempt {n}'s user process")
    poll(
        lambda: TaskRun.objects.filter(
            attempt__job_id=job_id, attempt__number=n, state="running", follower_token__isnull=False
        ).exists(),
        30,
        f"attempt {n}'s follower",
    )
    return container, first_line(lines, lambda t: t == marker)


def standby_of(client, job_id: str, n: int):
    """Attempt n's container of the job, made ahead and armed (started, waiting for its go)."""
    found = client.containers.list(
        all=True, sparse=True, filters={"label": [f"console.job={job_id}", f"console.attempt={n}"]}
    )
    made = next((c for c in found if c.attrs.get("State") == "running"), None)
    try:
        # Listed while its create is still in flight, a container cannot be inspected yet.
        return client.containers.get(made.id) if made is not None else None
    except docker.errors.NotFound:
        return None


def kill_job_repeatedly(stack: Stack, client, events: Events, bare: BareStart, j: int) -> list[dict]:
    """One job with R = RETRIES; its container is SIGKILLed RETRIES times; one sample per kill."""
    from faulttolerance.models import RecoveryRecord
    from jobs.models import Attempt

    job_id = create_job(stack, f"bench-kill-{j}", 'echo "attempt $MA_ATTEMPT user process"; exec sleep 100000', RETRIES)
    user_running: dict[int, int] = {}

    def event_at(action: str, attempt: int) -> int:
        found = events.select(action, **{"console.job": job_id, "console.attempt": str(attempt)})
        return found[0]["timeNano"] if found else 0

    for n in range(1, RETRIES + 2):
        container, user_running[n] = wait_attempt_running(client, job_id, n)
        bare.sample("interleaved")  # under the same load as the restart just measured
        if n == RETRIES + 1:
            break
        time.sleep(0.3)  # a healthy moment: the follower is reading, the hang watch has ticked
        # A training run dies hours in, long after its standby (the next attempt's container,
        # jobs/runtime/standby.py) was made and armed: kill once it is, as a real restart finds it.
        poll(partial(standby_of, client, job_id, n + 1), 30, f"attempt {n + 1}'s standby")
        container.kill()  # SIGKILL from outside: the console did not send it
    terminate(stack, job_id)
    attempts = {a.number: a for a in Attempt.objects.filter(job_id=job_id)}
    samples = []
    for n in range(1, RETRIES + 1):
        record = RecoveryRecord.objects.get(failed_attempt=attempts[n])
        samples.append(
            {
                "job": j,
                "retry": n,
                "level": attempts[n + 1].level,
                "class": record.failure_class,
                "die": event_at("die", n),
                "destroy": event_at("destroy", n),
                "attempt_ended": dt_ns(attempts[n].ended_at),
                "next_created": dt_ns(attempts[n + 1].created_at),
                "create": event_at("create", n + 1),
                "standby": 0 < event_at("create", n + 1) < event_at("die", n),
                "armed": 0 < event_at("start", n + 1) < event_at("die", n),
                "archive": event_at("extract-to-dir", n + 1),
                "start": event_at("start", n + 1),
                "user": user_running[n + 1],
                "db_detected": dt_ns(record.detected_at),
                "db_running_again": dt_ns(record.running_again_at),
            }
        )
    return samples


def console_container_restarts(stack: Stack, client, events: Events, bare: BareStart, jobs: int) -> list[dict]:
    return [sample for j in range(jobs) for sample in kill_job_repeatedly(stack, client, events, bare, j)]


# The first process runs for a second (its follower is attached and reading, as for any
# process that fails while training), then fails with a transient signature.
PROCESS_COMMAND = (
    'echo "run $MA_PROCESS_RUN attempt $MA_ATTEMPT user process"; '
    'if [ "$MA_ATTEMPT" = 1 ]; then sleep 3; echo "NCCL timeout"; exit 1; fi; exec sleep 100000'
)


def process_restart(stack: Stack, client, events: Events, bare: BareStart, j: int) -> dict:
    """One job whose first process fails with an NCCL timeout and is restarted in place."""
    from jobs.models import Attempt, TaskRun

    job_id = create_job(stack, f"bench-nccl-{j}", PROCESS_COMMAND, 3)
    container = poll(lambda: running_container(client, job_id, 1), 30, "the job's container")
    lines = lines_once(container, lambda t: t.startswith("run 2 attempt 2"), "the restarted process")
    bare.sample("interleaved")
    terminate(stack, job_id)
    attempts = {a.number: a for a in Attempt.objects.filter(job_id=job_id)}
    first_run = TaskRun.objects.get(attempt=attempts[1])
    return {
        "job": j,
        "level": attempts[2].level,
        "same_container": TaskRun.objects.get(attempt=attempts[2]).container_id == first_run.container_id,
        "exit": first_line(lines, lambda t: t == "NCCL timeout"),
        "marker": first_line(lines, lambda t: t.startswith("[console] process exited")),
        "detected": dt_ns(first_run.ended_at),
        "next_created": dt_ns(attempts[2].created_at),
        "next_started": dt_ns(attempts[2].started_at),
        "launcher": first_line(lines, lambda t: t.startswith("[console] process restarted")),
        "user": first_line(lines, lambda t: t.startswith("run 2 attempt 2")),
    }


def console_process_restarts(stack: Stack, client, events: Events, bare: BareStart, jobs: int) -> list[dict]:
    return [process_restart(stack, client, events, bare, j) for j in range(jobs)]


# -- (e) where a container start's time goes ------------------------------------------------------------
def spec_steps(client, runs: int) -> dict[str, list[float]]:
    """The console's own container spec (jobs.runtime.docker_hosts) and a bare busybox, step by
    step: create, first start of a new container, start of the stopped container."""
    import uuid

    from jobs.models import Attempt, DockerHost, TaskRun, TrainingJob
    from jobs.runtime import docker_hosts

    host = DockerHost.objects.get(name="local")
    out: dict[str, list[float]] = {}

    def timed(key: str, call, *args, **kwargs):
        t0 = time.perf_counter_ns()
        result = call(*args, **kwargs)
        out.setdefault(key, []).append(ms(time.perf_counter_ns() - t0))
        return result

    for i in range(runs + 1):  # the first round is a warm-up
        job = TrainingJob(
            id=uuid.uuid4(), name=f"bench-spec-{i}", image=BUSYBOX, command="exit 0", fault_tolerance=True
        )
        attempt = Attempt(job=job, number=1)
        task_run = TaskRun(attempt=attempt, index=0, host=host, container_name=f"bench-spec-{os.getpid()}-{i}")
        kwargs = docker_hosts.container_create_kwargs(job, attempt, task_run, [host])
        kwargs["environment"]["MA_ENV_CHECKS"] = "0"
        containers = []
        try:
            spec = timed("console spec: create", client.containers.create, **kwargs)
            containers.append(spec)
            timed("console spec: first start", spec.start)
            spec.wait()
            timed("console spec: start of the stopped container", spec.start)
            spec.wait()
            plain = timed(
                "busybox: create",
                client.containers.create,
                BUSYBOX,
                ["sh", "-c", "exit 0"],
                labels=LABELS,
                network_mode="none",
                name=f"bench-plain-{os.getpid()}-{i}",
            )
            containers.append(plain)
            timed("busybox: first start", plain.start)
            plain.wait()
            timed("busybox: start of the stopped container", plain.start)
            plain.wait()
        finally:
            for container in containers:
                container.remove(force=True)
    return {key: values[1:] for key, values in out.items()}


# -- report ----------------------------------------------------------------------------------------
def row(name: str, values: list[float], bare: float, docker: float | None, target: str = "") -> None:
    m = median(values)
    vs_docker = f"{m / docker:6.2f}x" if docker else "      "
    spread = f"{min(values):7.0f}-{max(values):<7.0f}" if values else ""
    print(f"  {name:<44} {len(values):>3} {m:9.0f} {spread:>16} {m / bare:7.2f}x  {vs_docker}  {target}")


def breakdown(title: str, samples: list[dict], steps: list[tuple[str, str, str]]) -> None:
    print(f"\n{title} (median ms of each step):")
    for label, start, end in steps:
        values = [ms(s[end] - s[start]) for s in samples if s.get(start) and s.get(end)]
        print(
            f"  {label:<62} {median(values):8.1f}   (n={len(values)}, {min(values, default=0):.1f}-"
            f"{max(values, default=0):.1f})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bare", type=int, default=20, help="bare starts to measure")
    parser.add_argument("--policy-runs", type=int, default=3, help="containers under Docker's on-failure policy")
    parser.add_argument("--jobs", type=int, default=3, help=f"console jobs killed {RETRIES} times each")
    parser.add_argument("--process-jobs", type=int, default=7, help="console jobs restarted at process level")
    parser.add_argument("--spec-runs", type=int, default=8, help="rounds of the step-by-step start (e)")
    parser.add_argument("--database", default="console_bench_restart")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    client.images.get(BUSYBOX)  # fails early when the image is missing

    # A long run has had its standby for hours when it fails; here it is made a second after the
    # attempt started (10 s by default), so that each kill does not wait for it.
    os.environ.setdefault("CONSOLE_STANDBY_AFTER_S", "1")
    stack = Stack(args.database, keep_db=args.keep_db)
    trace_path = enable_docker_trace(stack)
    with stack:
        events = Events()
        events.start()
        bare = None
        try:
            t0 = time.monotonic()
            bare = BareStart(client)
            for _ in range(args.bare):
                bare.sample()
                bare.sample_cli()
            print(f"(a) bare start: {time.monotonic() - t0:.1f} s")
            t0 = time.monotonic()
            steps = spec_steps(client, args.spec_runs)
            print(f"(e) container start step by step: {time.monotonic() - t0:.1f} s")
            t0 = time.monotonic()
            policy = docker_policy(client, events, args.policy_runs)
            print(f"(b) Docker on-failure policy: {time.monotonic() - t0:.1f} s")
            t0 = time.monotonic()
            process = console_process_restarts(stack, client, events, bare, args.process_jobs)
            print(f"(d) console process level: {time.monotonic() - t0:.1f} s")
            t0 = time.monotonic()
            container = console_container_restarts(stack, client, events, bare, args.jobs)
            print(f"(c) console container restarts: {time.monotonic() - t0:.1f} s")
            worker_log = Path(stack.tmp, "celery-worker.log").read_text()[-2000:]
            trace = read_trace(trace_path)
        finally:
            events.close()
            if bare is not None:
                bare.remove()

    # The baseline: every bare start, up front and between the console's restarts.
    bare_all = bare.samples["api"] + bare.samples["interleaved"]
    bare_ms = median(bare_all)
    docker_ms = {n: median(v) for n, v in policy["die_to_start"].items()}
    print(f"\nDocker {client.version()['Version']}, {os.cpu_count()} CPUs; medians in ms")
    print(f"  {'case':<44} {'n':>3} {'median':>9} {'min-max':>16} {'vs bare':>8}  {'vs pol.':>7}  target (median)")
    row("(a) bare start, API, up front", bare.samples["api"], bare_ms, None)
    row("(a) bare start, API, between the restarts", bare.samples["interleaved"], bare_ms, None)
    row("(a) bare start, API, all (the baseline)", bare_all, bare_ms, None)
    row("(a) bare start, `docker start` CLI", bare.samples["cli"], bare_ms, None)
    for n in range(1, RETRIES + 1):
        row(f"(b) Docker on-failure retry {n}: die -> start", policy["die_to_start"][n], bare_ms, docker_ms[n])
    for n in range(1, RETRIES + 1):
        row(
            f"    Docker on-failure retry {n}: start -> start",
            policy["start_to_start"][n],
            bare_ms,
            median(policy["start_to_start"][n]),
        )

    verdicts: list[tuple[str, bool]] = []
    container_level = [ms(s["user"] - s["die"]) for s in container if s["level"] == "container"]
    job_level = [ms(s["user"] - s["die"]) for s in container if s["level"] == "job"]
    ok = median(container_level) <= CONTAINER_TARGET_RATIO * bare_ms
    verdicts.append((f"container level <= {CONTAINER_TARGET_RATIO}x bare start", ok))
    row(
        "(c) console container level: die -> job again",
        container_level,
        bare_ms,
        docker_ms[1],
        f"<= {CONTAINER_TARGET_RATIO * bare_ms:.0f} {'MET' if ok else 'MISSED'}",
    )
    row("(c) console job level (same host): die -> job again", job_level, bare_ms, None)
    for n in range(1, RETRIES + 1):
        values = [ms(s["user"] - s["die"]) for s in container if s["retry"] == n]
        levels = "/".join(sorted({s["level"] for s in container if s["retry"] == n}))
        ok = median(values) < docker_ms[n]
        verdicts.append((f"console retry {n} < Docker retry {n}", ok))
        row(
            f"(c) console retry {n} ({levels}): die -> job again",
            values,
            bare_ms,
            docker_ms[n],
            f"< {docker_ms[n]:.0f} {'MET' if ok else 'MISSED'}",
        )
    started = [ms(s["start"] - s["die"]) for s in container if s["start"] > s["die"]]
    if started:
        row("(c) console, restarts that started a container: die -> start", started, bare_ms, None)
    db_values = [ms(s["db_running_again"] - s["db_detected"]) for s in container]
    row("(c) console, all retries: RecoveryRecord downtime", db_values, bare_ms, None)

    standbys = sum(1 for s in container if s["standby"])
    armed = sum(1 for s in container if s["armed"])
    print(f"  ({standbys} of {len(container)} container restarts took a standby made while the job ran,")
    print(f"   {armed} of them armed: started then too, the restart gave it its go)")

    process_values = [ms(s["user"] - s["exit"]) for s in process]
    ok = median(process_values) <= PROCESS_TARGET_MS
    verdicts.append((f"process level <= {PROCESS_TARGET_MS} ms", ok))
    row(
        "(d) console process level: exit -> running",
        process_values,
        bare_ms,
        docker_ms[1],
        f"<= {PROCESS_TARGET_MS} {'MET' if ok else 'MISSED'}",
    )
    ok = median(process_values) < docker_ms[1]
    verdicts.append(("process level < Docker retry 1", ok))
    bad = [s for s in process if s["level"] != "process" or not s["same_container"]]
    if bad:
        print(f"  warning: {len(bad)} process-level samples were not restarted in place: {bad}")

    breakdown(
        "(c) where the time goes, restarts that took an armed standby",
        [s for s in container if s["armed"]],
        [
            ("die -> attempt ended (follower noticed; claimed for the decision)", "die", "attempt_ended"),
            ("attempt ended -> next attempt created (classify, decide)", "attempt_ended", "next_created"),
            ("next attempt created -> job's first line (commit, take-over, go, checks)", "next_created", "user"),
        ],
    )
    breakdown(
        "(c) where the time goes, restarts that started a standby",
        [s for s in container if s["standby"] and not s["armed"]],
        [
            ("die -> attempt ended (follower noticed; claimed for the decision)", "die", "attempt_ended"),
            ("attempt ended -> next attempt created (classify, decide)", "attempt_ended", "next_created"),
            ("next attempt created -> `start` event (commit, re-check, start)", "next_created", "start"),
            ("`start` -> user process's first line (launcher env checks)", "start", "user"),
        ],
    )
    breakdown(
        "(c) where the time goes, container restarts that created their container",
        [s for s in container if not s["standby"]],
        [
            ("die -> attempt ended (follower noticed; claimed for the decision)", "die", "attempt_ended"),
            ("attempt ended -> next attempt created (classify, decide)", "attempt_ended", "next_created"),
            ("next attempt created -> `create` event (commit, stage, create)", "next_created", "create"),
            ("`create` -> `start` event (docker start)", "create", "start"),
            ("`start` -> user process's first line (launcher env checks)", "start", "user"),
        ],
    )
    breakdown(
        "(d) where the time goes, process level",
        process,
        [
            ("process's last line -> launcher's exit marker", "exit", "marker"),
            ("exit marker -> task run ended in the DB (follower)", "marker", "detected"),
            ("task run ended -> next attempt created (classify, decide)", "detected", "next_created"),
            ("next attempt created -> launcher restarts (commit, decision, FIFO wake)", "next_created", "launcher"),
            ("launcher restarts -> user process's first line", "launcher", "user"),
            ("(next attempt created -> attempt started in the DB)", "next_created", "next_started"),
        ],
    )

    trace_breakdown(trace, [(s["die"], s["user"]) for s in container], "(c) from death to the job again")
    if container:
        middle = sorted(container, key=lambda s: s["user"] - s["die"])[len(container) // 2]
        print("\n(c) the median restart's timeline: the worker's Docker calls from the death (ms after it)")
        for t0, t1, thread, method, endpoint in trace:
            if middle["die"] - 50e6 <= t0 <= middle["user"] and "/events" not in endpoint:
                at, until = ms(t0 - middle["die"]), ms(t1 - middle["die"])
                print(f"  {at:7.1f} {until:7.1f}  {thread:<22} {method} {endpoint}")
        for label, key in (("attempt ended", "attempt_ended"), ("next attempt created", "next_created")):
            print(f"  {ms(middle[key] - middle['die']):7.1f}          {label} (database)")
    trace_breakdown(trace, [(s["exit"], s["user"]) for s in process], "(d) from the exit to the restarted process")

    print("\n(e) a container start step by step (median ms; the console creates a new container per restart):")
    for key, values in steps.items():
        print(f"  {key:<62} {median(values):8.1f}   (n={len(values)}, {min(values):.1f}-{max(values):.1f})")

    print("\ntargets:")
    for name, met in verdicts:
        print(f"  {'MET   ' if met else 'MISSED'} {name}")
    if "Traceback" in worker_log:
        print(f"\nthe worker logged errors:\n{worker_log}")
    return 0 if all(met for _, met in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
