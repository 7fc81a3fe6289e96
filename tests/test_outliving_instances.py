"""Instances that outlived their attempt (reconcile.stop_instances_of_ended_attempts): the attempt
ended, no later attempt restarts in the container, and the instance still runs (or ended in place
and its container waits, still followed). The decision stops them once it commits; what is left
after a while had its stop lost, and reconcile stops it. What counts is table-tested here against
the real database; the stop against real containers; the whole path, with a worker killed between
its decision and its stop, in tests/test_multi_instance.py."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.models import Attempt, Phase, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, reconcile, stop
from tests.helpers import BUSYBOX, wait_for
from tests.pytest_env import TEST_LABEL

pytestmark = [pytest.mark.django_db]

LONG_AGO = timezone.timedelta(seconds=settings.OUTLIVED_STOP_GRACE_S + 5)


def _job(demo, name: str) -> TrainingJob:
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name=name, image=BUSYBOX, command="sleep 30")
    job.full_clean()
    job.save()
    return job


def _attempt(job, number: int, state: str, ended_ago=LONG_AGO) -> Attempt:
    now = timezone.now()
    ended = state == Attempt.State.ENDED
    return Attempt.objects.create(
        job=job,
        number=number,
        level="initial" if number == 1 else "process",
        state=state,
        started_at=now - ended_ago,
        ended_at=now - ended_ago if ended else None,
        outcome=Attempt.Outcome.FAILED if ended else "",
    )


def _run(attempt, host, container_id: str, state: str, **fields) -> TaskRun:
    return TaskRun.objects.create(
        attempt=attempt,
        index=0,
        host=host,
        container_name=docker_hosts.container_name(attempt.job, attempt.number, 0),
        container_id=container_id,
        state=state,
        started_at=attempt.started_at,
        **fields,
    )


FOLLOWED = {"follower_token": uuid.uuid4()}
IN_PLACE = {"ended_in_place": True, "exit_code": 1}
ENDED, RUNNING, STARTING = Attempt.State.ENDED, Attempt.State.RUNNING, Attempt.State.STARTING
R = TaskRun.State

# (case, attempt 1 and its run's state and fields, attempt 2 restarting in its container (its state
# and its run's) or None, whether attempt 1's run outlived its attempt)
CASES = [
    ("running under an ended attempt", ENDED, R.RUNNING, {}, None, True),
    ("ended in place, its container waits, followed", ENDED, R.EXITED, IN_PLACE | FOLLOWED, None, True),
    ("restarted in its container by the next attempt", ENDED, R.RUNNING, {}, (RUNNING, R.RUNNING), False),
    ("ended in place and restarted in it", ENDED, R.EXITED, IN_PLACE | FOLLOWED, (RUNNING, R.RUNNING), False),
    ("a restart in it still starting", ENDED, R.EXITED, IN_PLACE | FOLLOWED, (STARTING, R.CREATED), False),
    ("a restart in it stopped while starting", ENDED, R.RUNNING, {}, (ENDED, R.CREATED), True),
    ("a restart in it that could not start", ENDED, R.EXITED, IN_PLACE | FOLLOWED, (ENDED, R.START_FAILED), True),
    ("a restart in it that ran and ended", ENDED, R.EXITED, IN_PLACE | FOLLOWED, (ENDED, R.EXITED), False),
    ("ended, no longer followed (the container ended)", ENDED, R.EXITED, IN_PLACE, None, False),
    ("exited with its container", ENDED, R.EXITED, {"exit_code": 1}, None, False),
    ("running under a running attempt", RUNNING, R.RUNNING, {}, None, False),
]  # fmt: skip


@pytest.mark.parametrize(
    "attempt_state,run_state,fields,restart_in_it,outlived",
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_which_instances_outlived_their_attempt(demo, attempt_state, run_state, fields, restart_in_it, outlived):
    job = _job(demo, "outlived")
    run = _run(_attempt(job, 1, attempt_state), demo.host, "c" * 64, run_state, **fields)
    if restart_in_it is not None:
        state, its_run_state = restart_in_it
        _run(_attempt(job, 2, state), demo.host, run.container_id, its_run_state, reuses_container=True)
    assert TaskRun.outliving_their_attempt().filter(id=run.id).exists() is outlived


def test_the_decision_gets_its_own_stop_first(demo):
    """Right after the decision its own stop is under way: reconcile leaves the instance alone."""
    job = _job(demo, "just-decided")
    _run(_attempt(job, 1, ENDED, ended_ago=timezone.timedelta(0)), demo.host, "d" * 64, R.RUNNING)
    assert reconcile.stop_instances_of_ended_attempts() is False


def test_an_outliving_instance_is_asked_to_stop_once_a_minute(demo):
    """A wedged engine answers no stop: asked on every round, the stops would fill the control
    queue. Claimed with a conditional update, each is asked again only after a while."""
    job = _job(demo, "lost-stop")
    run = _run(_attempt(job, 1, ENDED), demo.host, "e" * 64, R.RUNNING)
    assert reconcile.stop_instances_of_ended_attempts() is True
    assert reconcile.stop_instances_of_ended_attempts() is False  # asked, not answered yet
    a_while_ago = timezone.now() - timezone.timedelta(seconds=reconcile.OUTLIVED_RESTOP_S + 1)
    TaskRun.objects.filter(id=run.id).update(outlived_stop_asked_at=a_while_ago)
    assert reconcile.stop_instances_of_ended_attempts() is True


# A job that ends at once on SIGTERM: a busybox sleep as PID 1 would ignore it for the stop's 5 s.
TERM_ENDS_IT = ["sh", "-c", "trap 'exit 0' TERM; sleep 300 & wait"]


def test_an_outliving_instance_is_stopped_and_one_restarted_in_place_is_not(demo, docker_client):
    labels = {TEST_LABEL[0]: TEST_LABEL[1]}
    outliving = docker_client.containers.run(BUSYBOX, TERM_ENDS_IT, detach=True, network_mode="none", labels=labels)
    reused = docker_client.containers.run(BUSYBOX, TERM_ENDS_IT, detach=True, network_mode="none", labels=labels)
    try:
        lost_stop = _run(_attempt(_job(demo, "lost-stop"), 1, ENDED), demo.host, outliving.id, R.RUNNING)
        job = _job(demo, "in-place")
        before = _run(_attempt(job, 1, ENDED), demo.host, reused.id, R.RUNNING)
        _run(_attempt(job, 2, RUNNING), demo.host, reused.id, R.RUNNING, reuses_container=True)

        assert stop.stop_outliving_instance(lost_stop.id) is True
        assert stop.stop_outliving_instance(before.id) is False  # checked again at the stop
        outliving.reload()
        reused.reload()
        assert (outliving.status, reused.status) == ("exited", "running")
    finally:
        outliving.remove(force=True)
        reused.remove(force=True)


def _ended_job(demo, name: str) -> TrainingJob:
    """A job the test's rows belong to, ended: the worker's scheduler leaves it alone."""
    job = _job(demo, name)
    TrainingJob.objects.filter(id=job.id).update(phase=Phase.TERMINATED, ended_at=timezone.now())
    return job


def _gone(docker_client, container) -> bool:
    return not docker_client.containers.list(all=True, sparse=True, filters={"id": container.id})


@pytest.mark.django_db(transaction=True)
def test_the_run_before_a_restart_stopped_while_it_started_is_stopped_and_followed_to_its_end(
    demo, worker, docker_client
):
    """A reschedule keeps the surviving instance's container for the next attempt; the user's Stop
    came while that attempt started, so its run stays "created" under an ended attempt. The run
    before still holds the container, its follower gone (its worker died). Before, that "created"
    run counted as having taken the container over: no pool adopted the run before and reconcile
    skipped it, so the container ran on. Now the worker's reconcile stops it and its pool follows
    it to its end: the end recorded, the container removed."""
    labels = {TEST_LABEL[0]: TEST_LABEL[1]}
    container = docker_client.containers.run(BUSYBOX, TERM_ENDS_IT, detach=True, network_mode="none", labels=labels)
    try:
        job = _ended_job(demo, "kept-then-stopped")
        before = _run(_attempt(job, 1, ENDED), demo.host, container.id, R.RUNNING)
        _run(_attempt(job, 2, ENDED), demo.host, container.id, R.CREATED, reuses_container=True)
        wait_for(lambda: _gone(docker_client, container), timeout=60, message="the container stopped and removed")
        before.refresh_from_db()
        assert (before.state, before.exit_code, before.follower_token) == (R.EXITED, 0, None)
    finally:
        for left in docker_client.containers.list(all=True, sparse=True, filters={"id": container.id}):
            left.remove(force=True)


@pytest.mark.django_db(transaction=True)
def test_a_restart_that_failed_to_start_after_its_follower_took_the_container_is_drained(demo, worker, docker_client):
    """A process-level restart: the follower handed over to the next run, whose start then failed
    (the launcher's signal timed out: its command may run all the same), and the worker died. The
    drain took only runs whose container ended, adoption only running ones, and the orphan scan
    none holding a token: reconcile asked to stop it every minute for good and the container
    stayed. Now the worker's reconcile drains it: stopped, followed to its end, the container removed."""
    labels = {TEST_LABEL[0]: TEST_LABEL[1]}
    container = docker_client.containers.run(BUSYBOX, TERM_ENDS_IT, detach=True, network_mode="none", labels=labels)
    try:
        job = _ended_job(demo, "failed-after-handover")
        _run(_attempt(job, 1, ENDED), demo.host, container.id, R.EXITED, ended_in_place=True, exit_code=1)
        dead = timezone.now() - timezone.timedelta(seconds=settings.FOLLOWER_STALE_AFTER_S + 5)
        handed = _run(_attempt(job, 2, ENDED), demo.host, container.id, R.START_FAILED, reuses_container=True,
                      follower_token=uuid.uuid4(), follower_heartbeat=dead)  # fmt: skip
        wait_for(lambda: _gone(docker_client, container), timeout=60, message="the container stopped and removed")
        handed.refresh_from_db()
        assert handed.follower_token is None
    finally:
        for left in docker_client.containers.list(all=True, sparse=True, filters={"id": container.id}):
            left.remove(force=True)
