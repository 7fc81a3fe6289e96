"""The walking skeleton's core path against real Docker, PostgreSQL, Redis and a Celery worker."""

import pytest

from jobs.models import Phase, TrainingJob
from jobs.runtime import stop
from tests.helpers import job_container, phase, submit_job, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def make_job(demo, **fields) -> TrainingJob:
    return submit_job(demo, **(dict(name="job") | fields))


def running_container(docker_client, job):
    return wait_for(
        lambda: job_container(docker_client, job.id),
        message="a running container",
    )


def test_sigkilled_job_restarts_until_max_restarts_used(demo, worker, docker_client):
    job = make_job(
        demo,
        fault_tolerance=True,
        max_restarts=2,
        command="echo attempt $MA_ATTEMPT; i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done",
    )
    for expected_attempt in (1, 2, 3):
        container = running_container(docker_client, job)
        assert container.labels["console.attempt"] == str(expected_attempt)
        wait_for(lambda: job.attempts.get(number=expected_attempt).task_runs.get().log_lines >= 3, message="log lines")
        container.kill()  # SIGKILL from outside: a retryable (transient) failure
        wait_for(
            lambda: not docker_client.containers.list(all=True, sparse=True, filters={"id": container.id}),
            message="removal",
        )
    wait_for(lambda: phase(job) == Phase.FAILED, message="Failed")
    assert (job.restarts_used, job.max_restarts) == (2, 2)
    records = list(job.recoveries.order_by("detected_at"))
    assert [r.restart for r in records] == [True, True, False]
    assert {r.failure_class for r in records} == {"transient"}
    assert all(r.exit_code == 137 for r in records)
    assert records[0].running_again_at is not None and records[0].downtime.total_seconds() > 0
    attempts = list(job.attempts.order_by("number"))
    assert [a.number for a in attempts] == [1, 2, 3]
    runs = [a.task_runs.get() for a in attempts]
    assert len({r.container_id for r in runs}) == 3
    assert all(r.exit_code == 137 and r.host_id == demo.host.id and r.started_at and r.ended_at for r in runs)


def test_plain_exit_1_is_a_user_error_and_not_restarted(demo, worker):
    job = make_job(demo, fault_tolerance=True, max_restarts=3, command="echo 'something broke'; exit 1")
    wait_for(lambda: phase(job) == Phase.FAILED, message="Failed")
    assert job.restarts_used == 0
    record = job.recoveries.get()
    assert (record.failure_class, record.restart, record.exit_code) == ("user_error", False, 1)


def test_successful_job_completes_with_its_whole_log(demo, worker):
    job = make_job(demo, command="for i in $(seq 1 500); do echo line $i; done")
    wait_for(lambda: phase(job) == Phase.COMPLETED, message="Completed")
    run = job.attempts.get().task_runs.get()
    from jobs.runtime.logs import read_lines

    assert [line.text for line in read_lines(run)] == [f"line {i}" for i in range(1, 501)]


def test_missing_image_fails_with_a_readable_reason(demo, worker):
    job = make_job(demo, image="console/does-not-exist:1", fault_tolerance=True, max_restarts=2)
    wait_for(lambda: phase(job) == Phase.FAILED, message="Failed")
    assert "does not exist on host local" in job.phase_reason
    assert job.restarts_used == 0


def test_stop_removes_the_container_and_does_not_restart(demo, worker, docker_client):
    job = make_job(
        demo, fault_tolerance=True, max_restarts=3, command="while true; do echo still here; sleep 0.2; done"
    )
    container = running_container(docker_client, job)
    assert stop.request_terminate(job.id)
    wait_for(lambda: phase(job) == Phase.TERMINATED, message="Terminated")
    # Removed right after the decision (which comes first, to keep restarts fast).
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"id": container.id}),
        timeout=10,
        message="the container to be removed",
    )
    assert job.restarts_used == 0 and not job.recoveries.exists()
    assert job.attempts.count() == 1
