"""Host faults with a real second Docker engine: a host that dies is isolated and
its work moves (job level, or only the lost instance with rescheduling). The
second engine is tests/second_engine.py; its `second_host` fixture is in conftest.py."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.conf import settings

from jobs.models import DockerHost, EventKind, Phase, TrainingJob
from jobs.runtime.logview import tail_texts
from tests.helpers import ended, submit_job, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def make_job(demo, **fields) -> TrainingJob:
    return submit_job(demo, **(dict(name="hosts") | fields))


def running_on(job, host_name: str) -> bool:
    attempt = job.attempts.order_by("-number").first()
    return bool(attempt) and attempt.task_runs.filter(host__name=host_name, state="running").exists()


def ticking_on_second(demo, ticks: int, first_line: str) -> TrainingJob:
    """A fault-tolerant job that prints `ticks` ticks, 0.1 s apart, running on the second host."""
    DockerHost.objects.filter(id=demo.host.id).update(enabled=False)  # place the job on "second"
    job = make_job(
        demo,
        fault_tolerance=True,
        max_restarts=2,
        command=f"{first_line}; for i in $(seq 1 {ticks}); do echo tick $i; sleep 0.1; done",
    )
    wait_for(lambda: running_on(job, "second"), message="the job running on the second host")
    return job


def test_a_lost_host_is_isolated_and_the_job_moves_to_a_healthy_one(demo, worker, second_host):
    engine, second = second_host
    job = ticking_on_second(demo, 60, "echo attempt $MA_ATTEMPT on $(hostname)")
    DockerHost.objects.filter(id=demo.host.id).update(enabled=True)
    wait_for(lambda: job.attempts.get().task_runs.get().log_lines >= 3, message="some log lines")
    killed_at = time.monotonic()
    engine.kill()
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    detection = time.monotonic() - killed_at
    assert job.phase == Phase.COMPLETED, job.phase_reason
    second.refresh_from_db()
    # Whichever noticed first isolates it: the job's follower or reconcile's host ping.
    assert second.isolated
    assert "unreachable" in second.isolation_reason or "lost connection" in second.isolation_reason
    record = job.recoveries.get()
    assert (record.failure_class, record.level, record.restart) == ("node_failure", "job", True)
    lost, moved = [a.task_runs.get() for a in job.attempts.order_by("number")]
    assert (lost.state, lost.host.name) == ("lost", "second")
    assert (moved.host.name, moved.exit_code) == ("local", 0)
    assert job.restarts_used == 1
    assert job.events.filter(kind=EventKind.HOST_ISOLATED).exists()
    assert detection < 60


def test_instance_rescheduling_moves_only_the_lost_instance(demo, worker, second_host):
    engine, second = second_host
    job = make_job(
        demo,
        node_count=2,
        fault_tolerance=True,
        max_restarts=2,
        pod_retry_num=1,
        command="echo rank $RANK attempt $MA_ATTEMPT; for i in $(seq 1 80); do echo tick $i; sleep 0.1; done",
    )
    wait_for(lambda: job.attempts.exists() and job.attempts.get().task_runs.filter(state="running").count() == 2,
             message="both instances running")  # fmt: skip
    first = {r.index: r for r in job.attempts.get().task_runs.select_related("host")}
    assert {r.host.name for r in first.values()} == {"local", "second"}  # spread over both hosts
    lost_index = next(i for i, r in first.items() if r.host.name == "second")
    kept_index = 1 - lost_index
    engine.kill()
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    assert (job.reschedules_used, job.restarts_used) == (1, 0)
    record = job.recoveries.get()
    assert (record.failure_class, record.level) == ("node_failure", "reschedule")
    second_attempt = {r.index: r for r in job.attempts.get(number=2).task_runs.select_related("host")}
    assert second_attempt[lost_index].host.name == "local"
    assert not second_attempt[lost_index].reuses_container
    # The surviving instance restarted in its own container (process level).
    assert second_attempt[kept_index].reuses_container
    assert second_attempt[kept_index].container_id == first[kept_index].container_id
    assert job.events.filter(kind=EventKind.RESCHEDULED).exists()


def test_an_idle_host_that_stops_answering_is_isolated(demo, worker, second_host):
    engine, second = second_host
    engine.kill()
    wait_for(lambda: DockerHost.objects.get(id=second.id).isolated, timeout=30, message="isolation by reconcile")
    assert "lost connection" in DockerHost.objects.get(id=second.id).isolation_reason
    assert not DockerHost.objects.get(id=demo.host.id).isolated
    # New jobs go to the healthy host only.
    job = make_job(demo, command="echo placed")
    wait_for(lambda: ended(job), message="the job to end")
    assert job.phase == Phase.COMPLETED
    assert job.attempts.get().task_runs.get().host.name == "local"


def test_a_slow_engine_is_isolated_only_once_it_stays_silent(demo, worker, second_host):
    """A ping that times out (the engine busy or hung: here SIGSTOPped) does not isolate a host
    that answered lately; an engine that answers nothing for HOST_LOST_AFTER_S is lost."""
    engine, second = second_host
    seen = DockerHost.objects.get(id=second.id).last_seen_at
    wait_for(lambda: DockerHost.objects.get(id=second.id).last_seen_at != seen, message="a fresh answer")
    warned = f"host {second.name} did not answer a ping".encode()
    log_start = worker.log_path.stat().st_size

    def missed_a_ping() -> bool:  # the worker's warning, written since the engine was stopped
        with open(worker.log_path, "rb") as log:
            log.seek(log_start)
            return warned in log.read()

    os.kill(engine.proc.pid, signal.SIGSTOP)
    try:
        wait_for(missed_a_ping, timeout=30, message="a missed ping")
        assert not DockerHost.objects.get(id=second.id).isolated
        os.kill(engine.proc.pid, signal.SIGCONT)
        seen = DockerHost.objects.get(id=second.id).last_seen_at
        wait_for(lambda: DockerHost.objects.get(id=second.id).last_seen_at != seen, message="an answer again")
        assert not DockerHost.objects.get(id=second.id).isolated
        os.kill(engine.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for(lambda: DockerHost.objects.get(id=second.id).isolated, timeout=settings.HOST_LOST_AFTER_S + 30,
                 message="isolation of a silent engine")  # fmt: skip
        assert time.monotonic() - stopped >= settings.HOST_LOST_AFTER_S - 1  # not at the first missed ping
        assert "lost connection" in DockerHost.objects.get(id=second.id).isolation_reason
    finally:
        os.kill(engine.proc.pid, signal.SIGCONT)


def test_a_job_on_an_engine_that_is_slow_for_a_moment_runs_on(demo, worker, second_host):
    """An engine that answers nothing for a few seconds (SIGSTOPped: its containers run on) is
    busy, not lost: its running job is neither lost nor moved and its host stays in service."""
    engine, second = second_host
    job = ticking_on_second(demo, 120, "echo attempt $MA_ATTEMPT")
    wait_for(lambda: job.attempts.get().task_runs.get().log_lines >= 3, message="some log lines")
    seen = DockerHost.objects.get(id=second.id).last_seen_at
    wait_for(lambda: DockerHost.objects.get(id=second.id).last_seen_at != seen, message="a fresh answer")
    os.kill(engine.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(8)  # more than a ping's timeout (3 s), less than HOST_LOST_AFTER_S
    finally:
        os.kill(engine.proc.pid, signal.SIGCONT)
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    assert (job.restarts_used, job.reschedules_used, job.attempts.count()) == (0, 0, 1)
    assert not DockerHost.objects.get(id=second.id).isolated
    texts = list(tail_texts(job.attempts.get().task_runs.get(), 500))
    assert [text for text in texts if text.startswith("tick ")] == [f"tick {i}" for i in range(1, 121)]
