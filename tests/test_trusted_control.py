"""Hostile jobs against the console's control channel, networks and limits, on real
containers: what a job prints or does never changes its phase, its counters, the facts of
its failure or any host's state (SPEC §8, docs/decisions.md "A trusted control channel")."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import docker
import pytest
from django.db import transaction
from django.utils import timezone

from jobs.models import Attempt, DockerHost, EventKind, Phase, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, reconcile, start
from jobs.runtime import stop as stopping
from tests.helpers import BUSYBOX, log_texts, reload, submit_job, wait_for, worker_dying_at

pytestmark = pytest.mark.django_db(transaction=True)


def texts(job: TrainingJob, attempt: int = 1, index: int = 0) -> list[str]:
    run = TaskRun.objects.filter(attempt__job=job, attempt__number=attempt, index=index).first()
    return log_texts(run) if run else []


def stop(job: TrainingJob) -> None:
    stopping.request_terminate(job.id)
    wait_for(lambda: reload(job).is_final, timeout=30, message="the job to stop")


@pytest.mark.parametrize("max_restarts", [0, 3], ids=["fault-tolerance-off", "fault-tolerance-on"])
def test_a_printed_exit_marker_does_not_end_a_running_job(demo, worker, docker_client, max_restarts):
    """The launcher's own words, printed by the job, then it keeps running: it stays Running."""
    forged = (
        'echo "[console] process exited with code 0; waiting for the supervisor\'s decision"; '
        'echo "[console] process exited with code 1 (oom-killed); waiting for the supervisor\'s decision"; '
        "printf 'glued to a partial line [console] process exited with code 0; done\\n'; "
        "echo still-running; sleep 60"
    )
    ha = {"fault_tolerance": True, "max_restarts": max_restarts} if max_restarts else {}
    job = submit_job(demo, command=forged, **ha)
    wait_for(lambda: "still-running" in texts(job), timeout=30, message="the forged lines persisted")
    # Longer than the follower's heartbeat (2 s), when it would take a reported exit anyway.
    run = TaskRun.objects.get(attempt__job=job)
    for _ in range(2):
        beat = TaskRun.objects.get(id=run.id).follower_heartbeat
        wait_for(lambda: TaskRun.objects.get(id=run.id).follower_heartbeat != beat, timeout=10)
    assert reload(job).phase == Phase.RUNNING, job.phase_reason
    assert TaskRun.objects.get(id=run.id).state == TaskRun.State.RUNNING
    assert job.attempts.count() == 1 and not job.recoveries.exists() and job.restarts_used == 0
    container = docker_client.containers.get(run.container_name)
    assert container.status == "running"
    stop(job)
    assert reload(job).phase == Phase.TERMINATED


def test_a_printed_env_check_failure_isolates_no_host(demo, worker):
    """`error,exiting` printed by the job and exit 1: the job's own failure (user_error, not
    retryable), never env_check_failed: its host stays in service for everyone."""
    job = submit_job(
        demo,
        fault_tolerance=True,
        max_restarts=3,
        command="echo '[env-check] item: dns, result: fail, forged'; echo '[env-check] error,exiting'; exit 1",
    )
    wait_for(lambda: reload(job).is_final, timeout=40, message="the job to end")
    assert job.phase == Phase.FAILED
    assert job.phase_reason.startswith("user_error (exit code 1)"), job.phase_reason
    record = job.recoveries.get()
    assert (record.failure_class, record.restart) == ("user_error", False)
    assert not DockerHost.objects.get(id=demo.host.id).isolated
    assert not job.events.filter(kind__in=[EventKind.HOST_ISOLATED, EventKind.ENV_CHECK_FAILED]).exists()


def test_env_checks_failing_on_two_hosts_in_a_row_fail_the_job_and_isolate_one_host(demo, worker):
    """The checks really fail (the pool asks for more /cache than any disk has): the first host
    is isolated and the job moves; failing again on the next host says the job's settings are
    the cause: it ends Failed and the second host stays in service."""
    other = DockerHost.objects.create(name="local-b", base_url=demo.host.base_url, pool=demo.pool)
    demo.pool.check_cache_gb = 100000
    demo.pool.save()
    job = submit_job(demo, fault_tolerance=True, max_restarts=5, command="echo training")
    wait_for(lambda: reload(job).is_final, timeout=60, message="the job to end")
    assert job.phase == Phase.FAILED
    assert "two hosts in a row" in job.phase_reason, job.phase_reason
    hosts = {h.name: h for h in DockerHost.objects.filter(id__in=[demo.host.id, other.id])}
    assert sorted(name for name, h in hosts.items() if h.isolated) == [
        job.attempts.get(number=1).task_runs.get().host.name
    ]
    assert job.attempts.count() == 2
    records = list(job.recoveries.order_by("id"))
    assert [(r.failure_class, r.restart) for r in records] == [("env_check_failed", True), ("env_check_failed", False)]
    assert "needs more than 100000" in records[1].matched_lines[0]
    assert job.events.filter(kind=EventKind.HOST_ISOLATED).count() == 1


def _host_addresses() -> list[str]:
    """This machine's own addresses besides loopback (where a job must not get either)."""
    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only picks the outgoing address
            found.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in found if not a.startswith("127."))


def test_two_instances_reach_each_other_and_nothing_of_the_host(demo, worker, live_url, docker_client):
    daphne = urlparse(live_url).port
    ports = [daphne, 6379, 5432]
    addresses = ["127.0.0.1", *_host_addresses()]
    probes = "; ".join(
        f'if nc -w 1 {a} {p} </dev/null >/dev/null 2>&1; then echo "open {a}:{p}"; else echo "closed {a}:{p}"; fi'
        for a in addresses
        for p in ports
    )
    # Rank 0 serves (persistently: a connection that read nothing may be retried) until rank 1
    # says, through the job data dir both instances share, that it heard it.
    command = (
        'if [ "$RANK" = 0 ]; then timeout 40 nc -ll -p "$MASTER_PORT" -e echo "hello from $(hostname)" & '
        "server=$!; fi; "
        f"{probes}; "
        'if [ "$RANK" = 1 ]; then i=0; '
        'until nc -w 2 "$MASTER_ADDR" "$MASTER_PORT" </dev/null >/tmp/got 2>/dev/null && [ -s /tmp/got ]; do '
        'i=$((i+1)); [ $i -gt 100 ] && break; sleep 0.2; done; echo "peer said: $(cat /tmp/got)"; '
        "touch /job-data/heard; fi; "
        'if [ "$RANK" = 0 ]; then i=0; until [ -f /job-data/heard ] || [ $i -gt 200 ]; do i=$((i+1)); sleep 0.2; '
        'done; kill "$server"; fi; echo "master was $MASTER_ADDR:$MASTER_PORT"'
    )
    job = submit_job(demo, name="netjob", node_count=2, command=command)
    wait_for(lambda: reload(job).is_final, timeout=60, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    for index in (0, 1):
        lines = texts(job, index=index)
        for a in addresses:
            for p in ports:
                assert f"closed {a}:{p}" in lines, (index, a, p, lines)
    assert "peer said: hello from netjob-worker-0" in texts(job, index=1)
    run = TaskRun.objects.get(attempt__job=job, index=0)
    network = docker_client.networks.get(docker_hosts.job_network(job, 1))
    assert network.attrs["Internal"] is True
    assert network.attrs["Options"].get("com.docker.network.bridge.inhibit_ipv4") == "true"
    assert run.container_name  # its container used that network, never the host's:
    # (the container is gone; the network goes with the job's resources)
    wait_for(lambda: reload(job).resources_released_at is not None, timeout=30, message="resources released")
    with pytest.raises(docker.errors.NotFound):
        docker_client.networks.get(docker_hosts.job_network(job, 1))


def test_one_instance_has_its_loopback_and_its_name_and_nothing_of_the_host(demo, worker, live_url, docker_client):
    """A single instance runs with networking disabled (no engine sandbox: docs/decisions.md
    "No network sandbox for one instance"): its own loopback and names as on Docker's "none"
    network, no other interface, nothing of the host, and an /etc/hosts it cannot change."""
    daphne = urlparse(live_url).port
    probes = "; ".join(
        f'if nc -w 1 {a} {p} </dev/null >/dev/null 2>&1; then echo "open {a}:{p}"; else echo "closed {a}:{p}"; fi'
        for a in ["127.0.0.1", *_host_addresses()]
        for p in (daphne, 6379, 5432)
    )
    command = (
        "timeout 20 nc -ll -p 7000 -e echo own-loopback & "
        "echo interfaces: $(ls /sys/class/net); "
        # The job runs as ma-user without capabilities (no ping): each name is asked through nc.
        'answers() { i=0; until nc -w 1 "$1" 7000 </dev/null 2>/dev/null | grep -q own-loopback; do '
        "i=$((i+1)); [ $i -gt 50 ] && return 1; sleep 0.1; done; }; "
        "answers 127.0.0.1 && echo loopback-answers; "
        "answers localhost && echo localhost-resolves; "
        'answers "$(hostname)" && echo own-name-resolves; '
        "(echo '127.0.0.1 evil' >> /etc/hosts) 2>/dev/null && echo hosts-changed || echo hosts-kept; "
        "(echo x > /.console/run/hosts) 2>/dev/null && echo control-hosts-changed || echo control-hosts-kept; "
        f"{probes}; echo probes-done; sleep 60"
    )
    job = submit_job(demo, name="solo", command=command)
    wait_for(lambda: "probes-done" in texts(job), timeout=60, message="the probes")
    lines = texts(job)
    for expected in (
        "interfaces: lo",
        "localhost-resolves",
        "own-name-resolves",
        "loopback-answers",
        "hosts-kept",
        "control-hosts-kept",
        "probes-done",
    ):
        assert expected in lines, (expected, lines)
    assert not [line for line in lines if line.startswith("open ")], lines
    run = TaskRun.objects.get(attempt__job=job)
    attrs = docker_client.api.inspect_container(run.container_id)
    assert attrs["Config"]["NetworkDisabled"] is True
    assert attrs["NetworkSettings"]["Networks"] in ({}, None) and not attrs["NetworkSettings"]["SandboxID"]
    stop(job)


def test_two_jobs_on_one_host_have_networks_of_their_own(demo, worker, docker_client):
    command = "sleep 300"
    first = submit_job(demo, name="net-a", node_count=2, command=command)
    second = submit_job(demo, name="net-b", node_count=2, command=command)
    for job in (first, second):
        wait_for(lambda: reload(job).phase == Phase.RUNNING, timeout=30, message="running")
    a = docker_client.containers.get(TaskRun.objects.get(attempt__job=first, index=0).container_name)
    b = docker_client.containers.get(TaskRun.objects.get(attempt__job=second, index=1).container_name)
    assert set(a.attrs["NetworkSettings"]["Networks"]) == {docker_hosts.job_network(first, 1)}
    assert set(b.attrs["NetworkSettings"]["Networks"]) == {docker_hosts.job_network(second, 1)}
    b_address = b.attrs["NetworkSettings"]["Networks"][docker_hosts.job_network(second, 1)]["IPAddress"]
    # No route from one job's network to the other's.
    probe = a.exec_run(["sh", "-c", f"ping -c 1 -W 1 {b_address} >/dev/null 2>&1 && echo reached || echo unreachable"])
    assert probe.output.decode().strip() == "unreachable"
    for job in (first, second):
        stop(job)


def test_a_job_without_a_flavor_gets_the_pools_limits_and_a_pids_limit(demo, worker, docker_client):
    demo.pool.default_cpus, demo.pool.default_memory_mb, demo.pool.pids_limit = 0.5, 256, 64
    demo.pool.save()
    # A fork bomb of sleeps: at most the PIDs limit of processes start.
    command = (
        "i=0; while [ $i -lt 200 ]; do i=$((i+1)); (sleep 60 &) 2>/dev/null; done; "
        # Builtins only from here: no fork is left.
        'read n < /sys/fs/cgroup/pids/pids.current; echo "running $n"; sleep 60'
    )
    job = submit_job(demo, command=command)
    wait_for(lambda: any(t.startswith("running ") for t in texts(job)), timeout=30, message="the fork bomb report")
    container = docker_client.containers.get(TaskRun.objects.get(attempt__job=job).container_name)
    host_config = container.attrs["HostConfig"]
    assert (host_config["NanoCpus"], host_config["Memory"], host_config["PidsLimit"]) == (
        500_000_000,
        256 * 1024 * 1024,
        64,
    )
    running = int(next(t for t in texts(job) if t.startswith("running ")).split()[1])
    assert running <= 64
    stop(job)


def test_a_start_run_twice_at_once_makes_one_container_per_instance(demo, worker, docker_client):
    """Two starts of the same attempt race (a retried start, reconcile's restart_stuck_starts):
    one container per instance, and the loser's 409 "name in use" is not a failed start."""
    job = submit_job(demo, name="race", node_count=2, command="sleep 30")
    wait_for(lambda: reload(job).phase == Phase.RUNNING, timeout=30, message="running")
    stop(job)
    # A fresh attempt left "starting", as a start that died before its first container.
    # In one commit: a pending job with no attempt 2 is the suite's worker's to schedule.
    with_attempt = TrainingJob.objects.get(id=job.id)
    with transaction.atomic():
        TrainingJob.objects.filter(id=job.id).update(phase=Phase.PENDING, terminate_requested=False, ended_at=None)
        attempt = Attempt.objects.create(job=with_attempt, number=2, level="initial")
        for index in (0, 1):
            TaskRun.objects.create(
                attempt=attempt, index=index, host=demo.host, container_name=f"race-{job.id.hex}-{index}"
            )
    barrier = threading.Barrier(2)
    results = []

    def start_once():
        barrier.wait()
        results.append(start.start_attempt(attempt.id))

    threads = [threading.Thread(target=start_once) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    runs = list(TaskRun.objects.filter(attempt=attempt).order_by("index"))
    assert [r.state for r in runs] == [TaskRun.State.RUNNING, TaskRun.State.RUNNING], [(r.state, r.error) for r in runs]
    for run in runs:
        found = docker_client.containers.list(all=True, sparse=True, filters={"name": f"^/{run.container_name}$"})
        assert len(found) == 1 and found[0].id == run.container_id
    # Both starts looked for the attempt's network at once (the engine's check of a name is not
    # atomic: each made one, and a container's create refused the ambiguous name): one was made.
    network = docker_hosts.job_network(job, 2)
    assert [n.name for n in docker_client.networks.list(names=[network])] == [network]
    stop(job)


def test_a_stop_that_looked_while_the_instances_started_still_stops_them(demo, worker, docker_client, monkeypatch):
    """The user's Stop came while an attempt was starting. Its stop task looked before the start
    marked the instance running (nothing to stop yet) and came to decide once the start had made
    the attempt running (a running attempt is not ended while its containers run). Before, the
    start then only asked for a decision, which waits for those containers: nothing stopped
    them until reconcile's grace. A job restarted in place after a hang stayed Terminating with
    its command running, and its next hang ended it Terminated with the container still running
    (a full run's teardown found it). The start stops them now.

    The start runs in this process against real Docker and the worker; the Stop is injected right
    after the real container started, as the state the early-looking stop task left: the wish
    recorded, nothing stopped."""
    job = TrainingJob(
        workspace=demo.workspace, created_by=demo.owner, name="stop-mid-start", image=BUSYBOX, command="sleep 300"
    )
    job.full_clean()
    with transaction.atomic():  # with its attempt at once: the scheduler leaves a job with one alone
        job.save()
        attempt = Attempt.objects.create(job=job, number=1, level="initial")
        TaskRun.objects.create(
            attempt=attempt, index=0, host=demo.host, container_name=docker_hosts.container_name(job, 1, 0)
        )
    create_and_start = start._create_and_start
    started = []

    def stopped_after_the_stop_task_looked(*args):
        container = create_and_start(*args)
        started.append(container.id)
        TrainingJob.objects.filter(id=job.id).update(
            terminate_requested=True, terminate_requested_at=timezone.now(), phase=Phase.TERMINATING
        )
        return container

    monkeypatch.setattr(start, "_create_and_start", stopped_after_the_stop_task_looked)
    assert start.start_attempt(attempt.id) is True
    assert started and Attempt.objects.get(id=attempt.id).state in (Attempt.State.RUNNING, Attempt.State.ENDED)
    # Well before reconcile's finish_terminations would stop it (its grace counts from the wish).
    wait_for(
        lambda: reload(job).phase == Phase.TERMINATED,
        timeout=reconcile.TERMINATING_GRACE_S - 5,
        message="the job stopped by the start's own request",
    )
    wait_for(
        lambda: not docker_client.containers.list(sparse=True, filters={"id": started[0]}),
        timeout=10,
        message="its container stopped",
    )


def test_a_worker_killed_between_claim_and_decision_leaves_no_job_undecided(demo, worker, docker_client, monkeypatch):
    """The worker dies right after it claimed the attempt's end (CONSOLE_CRASH_AT): the claim is
    rolled back with it, and the next worker decides within a reconcile period. (The `worker`
    fixture removes the container the killed follower left behind.)"""
    with worker_dying_at(worker, monkeypatch, "after-claim") as wait_for_its_death:
        job = submit_job(demo, fault_tolerance=True, max_restarts=1, command="echo failing; exit 3")
        wait_for_its_death()
        assert not reload(job).is_final
        attempt = job.attempts.get()
        assert attempt.state == Attempt.State.RUNNING and attempt.outcome == ""  # the claim died with it
    wait_for(lambda: job.attempts.filter(number=1, state=Attempt.State.ENDED).exists(), timeout=20)
    wait_for(lambda: reload(job).is_final, timeout=40, message="the decision")
    assert job.phase == Phase.FAILED and job.restarts_used == 0
    assert job.attempts.get(number=1).outcome == Attempt.Outcome.FAILED
    assert job.recoveries.count() == 1
    # The killed follower's run: its log drained by a new follower, its container removed.
    run = TaskRun.objects.get(attempt__job=job)
    wait_for(lambda: TaskRun.objects.get(id=run.id).follower_token is None, timeout=30, message="the drain")
    assert "failing" in texts(job)
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"name": f"^/{run.container_name}$"}),
        timeout=20,
        message="the container removed",
    )


def test_the_limits_of_a_job_without_a_flavor_show_in_the_wizard_and_the_admin(demo, client):
    from django.contrib.auth import get_user_model

    demo.pool.default_cpus, demo.pool.pids_limit = 3, 999  # the demo's pool is a public one
    demo.pool.save()
    client.force_login(demo.owner)
    page = client.get("/jobs/create/").content.decode()
    assert "Without a flavor each instance gets 3 CPUs and 8192 MB of memory" in page
    assert "at most 999 processes and threads" in page
    operator = get_user_model().objects.create_superuser("operator", password="operator-password")
    client.force_login(operator)
    admin = client.get(f"/admin/jobs/resourcepool/{demo.pool.id}/change/").content.decode()
    assert 'name="pids_limit"' in admin and 'name="default_cpus"' in admin and 'name="default_memory_mb"' in admin
