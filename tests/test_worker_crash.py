"""Fault tests: the Celery worker is SIGKILLed (its whole process group) while jobs run.
Nothing the container wrote or did while no supervisor was alive may be lost or doubled."""

from __future__ import annotations

import pytest

from jobs.models import Attempt, Phase, TaskRun, TrainingJob
from jobs.runtime.logs import read_lines
from tests.helpers import log_texts, phase, submit_job, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker")]

TOTAL = 3000
# ~6 s of output: 3000 numbered lines, a 0.1 s pause every 50 lines.
NUMBERED = f"for i in $(seq 1 {TOTAL}); do echo n=$i; if [ $((i % 50)) -eq 0 ]; then sleep 0.1; fi; done"


def make_job(demo, command: str, **fields) -> TrainingJob:
    return submit_job(demo, name="crash-job", command=command, **fields)


def task_run(job, attempt: int = 1) -> TaskRun | None:
    return TaskRun.objects.filter(attempt__job=job, attempt__number=attempt, index=0).first()


def container_of(docker_client, job, attempt: int = 1):
    found = docker_client.containers.list(
        all=True, sparse=True, filters={"label": [f"console.job={job.id}", f"console.attempt={attempt}"]}
    )
    return found[0] if found else None


def user_lines(texts) -> list[str]:
    """The job's own output: without the platform's environment-check and launcher lines."""
    return [t for t in texts if not t.startswith(("[env-check]", "[console]"))]


def docker_log_lines(container) -> int:
    return len(container.logs().splitlines())


def test_worker_killed_mid_log_loses_and_doubles_no_line(demo, worker, docker_client):
    job = make_job(demo, NUMBERED)
    wait_for(lambda: (run := task_run(job)) and run.log_lines >= 100, message="the first lines persisted")
    container = container_of(docker_client, job)
    assert container is not None and container.status in ("running", "created")

    worker.kill()
    persisted_at_kill = task_run(job).log_lines
    assert persisted_at_kill < TOTAL, "the job ended before the worker was killed: make it run longer"
    # The container goes on writing while no worker follows it.
    wait_for(
        lambda: docker_log_lines(container) >= persisted_at_kill + 300, message="lines written while no worker ran"
    )
    assert task_run(job).log_lines == persisted_at_kill  # really nobody followed
    worker.ensure_running()

    wait_for(lambda: phase(job) == Phase.COMPLETED, timeout=60, message="Completed")
    run = task_run(job)
    lines = read_lines(run)
    assert [line.text for line in lines] == [f"n={i}" for i in range(1, TOTAL + 1)]
    assert [line.number for line in lines] == list(range(1, TOTAL + 1))
    assert run.log_lines == TOTAL
    assert all(a.ts_ns <= b.ts_ns for a, b in zip(lines, lines[1:], strict=False))
    assert (run.state, run.exit_code) == (TaskRun.State.EXITED, 0)
    assert job.attempts.count() == 1 and not job.recoveries.exists()
    wait_for(lambda: container_of(docker_client, job) is None, message="the container removed")


def test_container_killed_while_no_worker_runs_is_still_restarted(demo, worker, docker_client):
    command = (
        'echo attempt $MA_ATTEMPT; if [ "$MA_ATTEMPT" = 1 ]; then '
        "while true; do echo tick; sleep 0.1; done; fi; echo finished"
    )
    job = make_job(demo, command, fault_tolerance=True, max_restarts=2)
    wait_for(lambda: (run := task_run(job)) and run.log_lines >= 3, message="attempt 1 followed")
    container = container_of(docker_client, job)

    worker.kill()
    container.kill()  # SIGKILL from outside while the supervisor is down
    container.reload()
    assert container.status == "exited" and container.attrs["State"]["ExitCode"] == 137
    assert phase(job) == Phase.RUNNING  # nobody noticed yet
    written = [line.decode() for line in container.logs().splitlines()]
    worker.ensure_running()

    wait_for(lambda: phase(job) == Phase.COMPLETED, timeout=60, message="Completed after a restart")
    assert job.restarts_used == 1
    record = job.recoveries.get()
    assert (record.failure_class, record.exit_code, record.restart) == ("transient", 137, True)
    assert record.level == "container"  # the container itself died: it is recreated (SPEC §4)
    assert record.failed_attempt.number == 1 and record.next_attempt.number == 2
    assert record.running_again_at is not None

    attempts = list(job.attempts.order_by("number"))
    assert [(a.number, a.outcome) for a in attempts] == [
        (1, Attempt.Outcome.FAILED),
        (2, Attempt.Outcome.SUCCEEDED),
    ]
    first, second = task_run(job, 1), task_run(job, 2)
    assert (first.exit_code, second.exit_code) == (137, 0)
    assert first.container_id != second.container_id
    assert user_lines(log_texts(second)) == ["attempt 2", "finished"]
    first_lines = log_texts(first)
    assert user_lines(first_lines)[0] == "attempt 1" and set(user_lines(first_lines)[1:]) == {"tick"}
    # What the container wrote up to its kill, even unfollowed, is in the persisted log.
    assert first_lines == written
