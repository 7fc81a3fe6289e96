"""Starts that race (jobs/runtime/start.py). A start whose attempt was stopped meanwhile removes
what it started; one that lost to another start of the same attempt removes nothing (the winner's
container may already be the next attempt's); one whose job was deleted meanwhile (stopped, then
deleted, while it was still creating containers) removes the containers it made: no row is left
to find them by, and reconcile leaves a container no task run knows alone for ten minutes.

The supervisor's own start runs in this process against real Docker; the other party's move is
injected right after the real container is created, the moment the race leaves open."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import Attempt, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, schedule, start
from tests.conftest import BUSYBOX, TEST_LABEL

pytestmark = [pytest.mark.django_db]


def _job_and_attempt(demo):
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name="race", image=BUSYBOX, command="sleep 30")
    job.full_clean()
    job.save()
    return job, schedule.new_attempt(job, [demo.host], "initial")  # its start would follow the commit


def _containers_of(docker_client, job) -> list:
    labels = {"label": [f"console.job={job.id}", "=".join(TEST_LABEL)]}
    return docker_client.containers.list(all=True, sparse=True, filters=labels)


def test_a_start_whose_attempt_was_stopped_meanwhile_removes_what_it_started(demo, docker_client, monkeypatch):
    """The user's Stop ended the attempt while its start was creating the container: no follower
    takes a run of an ended attempt, so the start removes the container and ends the run."""
    job, attempt = _job_and_attempt(demo)
    create_and_start = start._create_and_start

    def stopped_meanwhile(*args):
        container = create_and_start(*args)
        Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.ENDED, ended_at=timezone.now())
        return container

    monkeypatch.setattr(start, "_create_and_start", stopped_meanwhile)
    try:
        assert start.start_attempt(attempt.id) is False
        run = TaskRun.objects.get(attempt=attempt)
        assert run.state == TaskRun.State.EXITED and "Stopped while" in run.error
        assert _containers_of(docker_client, job) == []
    finally:
        for container in _containers_of(docker_client, job):
            container.remove(force=True)


def test_a_start_that_lost_to_another_start_of_its_attempt_leaves_the_winners_container(
    demo, docker_client, monkeypatch
):
    """Two starts of one attempt (reconcile queues another when the first seems stuck): the other
    one started the instance, the attempt ran and ended, and its container may now be the next
    attempt's (a process-level restart in place). The slower start finds the attempt ended; it
    started nothing, so it removes nothing."""
    job, attempt = _job_and_attempt(demo)
    create_and_start = start._create_and_start
    won = []

    def the_other_start_wins_meanwhile(job_, attempt_, task_run, hosts):
        container = create_and_start(job_, attempt_, task_run, hosts)  # the other start's container
        now = timezone.now()
        TaskRun.objects.filter(id=task_run.id).update(
            state=TaskRun.State.RUNNING, container_id=container.id, started_at=now
        )
        Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.ENDED, started_at=now, ended_at=now)
        won.append(container.id)
        return container  # this start takes the container it finds under the run's name

    monkeypatch.setattr(start, "_create_and_start", the_other_start_wins_meanwhile)
    try:
        assert start.start_attempt(attempt.id) is False
        assert won and docker_client.containers.get(won[0]).status == "running"
        assert TaskRun.objects.get(attempt=attempt).state == TaskRun.State.RUNNING, "the winner's to end"
    finally:
        for container in _containers_of(docker_client, job):
            container.remove(force=True)


def test_a_start_that_won_an_instance_but_not_the_attempt_leaves_its_container(demo, docker_client, monkeypatch):
    """The other way round: this start moved the instance to running, the other start moved the
    attempt (so it ran, and its followers took the instances), and the attempt ended meanwhile.
    This start finds it ended; the container may be the next attempt's: it stays."""
    job, attempt = _job_and_attempt(demo)
    create_and_start = start._create_and_start
    seen = []

    def the_other_start_ran_the_attempt(*args):
        container = create_and_start(*args)
        now = timezone.now()
        Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.ENDED, started_at=now, ended_at=now)
        seen.append(container.id)
        return container

    monkeypatch.setattr(start, "_create_and_start", the_other_start_ran_the_attempt)
    try:
        assert start.start_attempt(attempt.id) is False
        assert seen and docker_client.containers.get(seen[0]).status == "running"
    finally:
        for container in _containers_of(docker_client, job):
            container.remove(force=True)


def test_a_start_whose_job_was_deleted_meanwhile_removes_its_container(demo, docker_client, monkeypatch):
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name="gone", image=BUSYBOX, command="sleep 30")
    job.full_clean()
    job.save()
    attempt = schedule.new_attempt(job, [demo.host], "initial")  # its start would follow the commit
    create = docker_hosts.create_container
    made = []

    def create_then_delete_the_job(*args, **kwargs):
        container = create(*args, **kwargs)
        made.append(container.id)
        TrainingJob.objects.filter(id=job.id).delete()  # the user's Stop and Delete, meanwhile
        return container

    monkeypatch.setattr(docker_hosts, "create_container", create_then_delete_the_job)
    assert start.start_attempt(attempt.id) is False
    assert made, "the start created no container: the race was not reached"
    labels = {"label": [f"console.job={job.id}", "=".join(TEST_LABEL)]}
    assert docker_client.containers.list(all=True, sparse=True, filters=labels) == []
