"""The decision at an attempt's end writes the attempt's outcome with its claim (one statement
where a claim, a re-read of the preemption and an outcome were three): each outcome, the
preempted one included, and what a restart in place asks the database. Rows only, no Docker,
no worker: what follows the commit (the start, the removal of a preempted attempt's
containers) is never reached in a test that rolls back."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from faulttolerance.models import RecoveryRecord
from jobs.models import Attempt, Phase, TaskRun, TrainingJob
from jobs.runtime import decide, docker_hosts

pytestmark = pytest.mark.django_db


def _running(demo, name: str, **settings) -> tuple[TrainingJob, Attempt]:
    job = TrainingJob(
        workspace=demo.workspace, created_by=demo.owner, name=name, image="busybox", command="true", **settings
    )
    job.full_clean()
    job.save()
    TrainingJob.objects.filter(id=job.id).update(phase=Phase.RUNNING)
    now = timezone.now()
    attempt = Attempt.objects.create(job=job, number=1, level="initial", state=Attempt.State.RUNNING, started_at=now)
    return job, attempt


def _ended(attempt: Attempt, demo, exit_code: int, **fields) -> TaskRun:
    now = timezone.now()
    return TaskRun.objects.create(
        attempt=attempt, index=0, host=demo.host, container_name=docker_hosts.container_name(attempt.job, 1, 0),
        container_id="c0ffee", state=TaskRun.State.EXITED, exit_code=exit_code, started_at=now, ended_at=now, **fields,
    )  # fmt: skip


def test_an_attempt_that_succeeded_ends_succeeded_and_the_job_completed(demo):
    job, attempt = _running(demo, "ok")
    _ended(attempt, demo, 0)
    assert decide.attempt_may_have_ended(attempt.id) is True
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome) == (Attempt.State.ENDED, Attempt.Outcome.SUCCEEDED)
    assert TrainingJob.objects.get(id=job.id).phase == Phase.COMPLETED


def test_a_preempted_attempt_ends_preempted_whatever_its_instances_exit_code(demo):
    """The scheduler claimed the attempt (preempted_at, preempted_by) before its instance ended
    with 143 (its SIGTERM): not a failure, and the job queues again."""
    job, attempt = _running(demo, "low", max_restarts=0)
    high, _ = _running(demo, "high")
    Attempt.objects.filter(id=attempt.id).update(preempted_at=timezone.now(), preempted_by=high)
    _ended(attempt, demo, 143)
    assert decide.attempt_may_have_ended(attempt.id) is True
    attempt.refresh_from_db()
    assert (attempt.outcome, attempt.preempted_by_id) == (Attempt.Outcome.PREEMPTED, high.id)
    job.refresh_from_db()
    assert (job.phase, job.restarts_used) == (Phase.PENDING, 0)
    assert RecoveryRecord.objects.get(job=job).failure_class == "preempted"


def test_a_restart_in_place_is_decided_in_thirteen_statements_with_the_outcome_in_the_claim(demo):
    """A process killed by a signal its container survived (ended in place): transient, restarted
    in the same container. The claim writes the outcome and proves the attempt was not preempted;
    there is no re-read of the preemption and no outcome of its own (fifteen statements before)."""
    job, attempt = _running(demo, "killed", fault_tolerance=True, max_restarts=3)
    _ended(attempt, demo, 137, ended_in_place=True)
    with CaptureQueriesContext(connection) as queries:
        assert decide.attempt_may_have_ended(attempt.id) is True
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome) == (Attempt.State.ENDED, Attempt.Outcome.FAILED)
    following = Attempt.objects.get(job=job, number=2)
    assert (following.level, following.task_runs.get().reuses_container) == ("process", True)
    record = RecoveryRecord.objects.get(job=job)
    assert (record.failure_class, record.rule, record.next_attempt_id) == (
        "transient",
        "killed-by-signal",
        following.id,
    )
    job.refresh_from_db()
    assert (job.phase, job.restarts_used) == (Phase.RESTARTING, 1)
    statements = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) == 13, "\n".join(statements)
