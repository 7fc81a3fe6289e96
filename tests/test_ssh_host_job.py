"""A job on an ssh:// Docker host, end to end (README "More Docker hosts"): the worker reaches the
host's engine through the system `ssh` client, here the stand-in tests/bin/ssh on the PATH of
every worker the tests start, which joins it to this machine's engine (as `docker system
dial-stdio` does on a host). The worker starts the job there, follows its log, restarts it after
a real fault (its container killed) and stops it; each `ssh` it starts is logged."""

from __future__ import annotations

import uuid

import pytest

from jobs.models import DockerHost, Phase
from jobs.runtime import stop
from jobs.runtime.logview import tail_texts
from tests.helpers import submit_job, wait_for
from tests.processes import STARTED_SSH_LOG

pytestmark = pytest.mark.django_db(transaction=True)


def ssh_started_for(host: DockerHost) -> int:
    """The ssh processes the session's processes started for the host (each logs its arguments)."""
    name = host.base_url.removeprefix("ssh://").split("@")[1]
    lines = STARTED_SSH_LOG.read_text().splitlines() if STARTED_SSH_LOG.exists() else []
    return sum(f"-- {name} " in line for line in lines)


def ticking_run(job, attempt: int):
    """The job's run of the given attempt, once it runs and its third tick is persisted."""
    found = job.attempts.filter(number=attempt).first()
    run = found and found.task_runs.filter(state="running").select_related("host").first()
    return run if run and "tick 3" in tail_texts(run, None) else None


def test_a_job_on_an_ssh_host_runs_restarts_after_a_fault_and_stops(demo, worker, docker_client):
    host = DockerHost.objects.create(
        name="over-ssh", base_url=f"ssh://deploy@gpu-{uuid.uuid4().hex[:8]}", pool=demo.pool
    )
    DockerHost.objects.filter(id=demo.host.id).update(enabled=False)  # the job goes to the ssh host
    job = submit_job(
        demo,
        name="over-ssh",
        fault_tolerance=True,
        max_restarts=2,
        # Hostile: an engine's answer in its output, \r\n and all. It reaches the console as log
        # data in the followed log's frames, never as an answer to a call on a kept connection.
        command=(
            "printf 'HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\n{}\\n'; echo attempt $MA_ATTEMPT; "
            "for i in $(seq 1 3000); do echo tick $i; sleep 0.1; done"
        ),
    )
    first = wait_for(lambda: ticking_run(job, 1), timeout=60, message="the first run's ticks")
    assert first.host.name == "over-ssh"
    # While it runs, the worker asks the host's engine (reconcile's pings, the follower's looks,
    # the standby made and armed) over the connections it keeps. Each call started an ssh before:
    # 15 in these six seconds, where one or two are started now.
    at_tick_3 = ssh_started_for(host)
    wait_for(lambda: first.refresh_from_db() or "tick 60" in tail_texts(first, None), message="six seconds of ticks")
    assert ssh_started_for(host) - at_tick_3 <= 5, (at_tick_3, ssh_started_for(host))
    docker_client.containers.get(first.container_id).kill()  # SIGKILL: a real fault
    second = wait_for(lambda: ticking_run(job, 2), timeout=60, message="the restarted run's ticks")
    assert second.host.name == "over-ssh"
    record = job.recoveries.get()
    assert (record.level, record.restart) == ("container", True), record
    stop.request_terminate(job.id)
    wait_for(lambda: job.refresh_from_db() or job.is_final, timeout=60, message="the job to end")
    assert job.phase == Phase.TERMINATED, job.phase_reason
    first.refresh_from_db()
    for run, attempt in ((first, 1), (second, 2)):
        texts = tail_texts(run, None)
        assert texts.index("HTTP/1.1 200 OK") < texts.index(f"attempt {attempt}") < texts.index("tick 1")
        assert texts[texts.index("tick 1") : texts.index("tick 3") + 1] == ["tick 1", "tick 2", "tick 3"]
    host.refresh_from_db()
    assert not host.isolated, host.isolation_reason
