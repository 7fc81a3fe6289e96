"""Two workers, one killed mid-job (README, "Production": two or more Celery workers): the other
takes over its followers from the database (claims with a heartbeat), and nothing is lost or
done twice — every line persisted once, one attempt, one container, one decision."""

from __future__ import annotations

import pytest
from django.conf import settings

from jobs.models import Phase, TaskRun, TrainingJob
from jobs.runtime.logs import read_lines
from tests.helpers import submit_job, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

TOTAL = 2000
# ~8 s of output: numbered lines, a 0.2 s pause every 50.
NUMBERED = f"for i in $(seq 1 {TOTAL}); do echo n=$i; if [ $((i % 50)) -eq 0 ]; then sleep 0.2; fi; done"


def run_of(job: TrainingJob) -> TaskRun | None:
    return TaskRun.objects.filter(attempt__job=job, index=0).order_by("attempt__number").first()


def test_a_killed_workers_instance_is_taken_over_by_the_other(demo, worker, second_worker, docker_client):
    job = submit_job(demo, name="two-workers", command=NUMBERED)
    wait_for(lambda: (run := run_of(job)) and run.log_lines >= 100, message="the first lines persisted by worker 1")
    first_token = run_of(job).follower_token
    assert first_token is not None
    second_worker.start()

    worker.kill()  # the worker that started and follows the instance dies mid-log
    at_kill = run_of(job).log_lines
    assert at_kill < TOTAL, "the job ended before the worker was killed: make it run longer"
    wait_for(
        lambda: (run := run_of(job)).follower_token not in (None, first_token) and run.log_lines > at_kill,
        timeout=settings.FOLLOWER_STALE_AFTER_S + 20,
        message="worker 2 to adopt the instance and go on persisting",
    )
    wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=60, message="the job to end")

    job.refresh_from_db()
    assert job.phase == Phase.COMPLETED, job.phase_reason
    run = run_of(job)
    lines = read_lines(run)
    assert [line.text for line in lines] == [f"n={i}" for i in range(1, TOTAL + 1)]  # none lost, none twice
    assert [line.number for line in lines] == list(range(1, TOTAL + 1))
    assert (run.state, run.exit_code, run.follower_token) == (TaskRun.State.EXITED, 0, None)
    assert job.attempts.count() == 1 and not job.recoveries.exists()  # decided once, never restarted
    assert job.events.filter(kind="completed").count() == 1
    containers = docker_client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job.id}"})
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job.id}"}),
        message="the container removed by worker 2",
    )
    assert len(containers) <= 1
