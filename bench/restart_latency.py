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
    running_container,
)
from bench._restart_report import RETRIES, report  # noqa: E402
from bench._stack import BENCH_LABEL, BUSYBOX, Stack  # noqa: E402
from bench._trace import enable_docker_trace, ms, read_trace  # noqa: E402
from tests.shared import wait_for  # noqa: E402


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

    container = wait_for(lambda: running_container(client, job_id, n), 30, 0.05, f"attempt {n}'s container")
    marker = f"attempt {n} user process"
    lines = lines_once(container, lambda t: t == marker, f"attempt {n}'s user process")
    wait_for(
        lambda: TaskRun.objects.filter(
            attempt__job_id=job_id, attempt__number=n, state="running", follower_token__isnull=False
        ).exists(),
        30,
        0.05,
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
        wait_for(partial(standby_of, client, job_id, n + 1), 30, 0.05, f"attempt {n + 1}'s standby")
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
    container = wait_for(lambda: running_container(client, job_id, 1), 30, 0.05, "the job's container")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bare", type=int, default=20, help="bare starts to measure")
    parser.add_argument("--policy-runs", type=int, default=3, help="containers under Docker's on-failure policy")
    parser.add_argument("--jobs", type=int, default=3, help=f"console jobs killed {RETRIES} times each")
    parser.add_argument("--process-jobs", type=int, default=7, help="console jobs restarted at process level")
    parser.add_argument("--spec-runs", type=int, default=8, help="rounds of the step-by-step start (e)")
    parser.add_argument("--database", default="console_bench_restart")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    parser.add_argument(
        "--trace-sql", action="store_true", help="also trace the worker's SQL (the median process restart's timeline)"
    )
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    client.images.get(BUSYBOX)  # fails early when the image is missing

    # A long run has had its standby for hours when it fails; here it is made a second after the
    # attempt started (10 s by default), so that each kill does not wait for it.
    os.environ.setdefault("CONSOLE_STANDBY_AFTER_S", "1")
    stack = Stack(args.database, keep_db=args.keep_db)
    trace_path = enable_docker_trace(stack, sql=args.trace_sql)
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

    return report(
        docker_version=client.version()["Version"],
        bare=bare.samples,
        policy=policy,
        process=process,
        container=container,
        steps=steps,
        trace=trace,
        worker_log=worker_log,
    )


if __name__ == "__main__":
    sys.exit(main())
