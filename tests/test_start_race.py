"""Starts that race (jobs/runtime/start.py). A start whose attempt was stopped meanwhile removes
what it started; one that lost to another start of the same attempt removes nothing (the winner's
container may already be the next attempt's); one whose job was deleted meanwhile (stopped, then
deleted, while it was still creating containers) removes the containers it made: no row is left
to find them by, and reconcile leaves a container no task run knows alone for ten minutes.
A Stop stops the live container of a restart in place that is still starting, and the decision
that ends a stopped job stops a container whose run was ended as hung (its command still runs).

The supervisor's own start runs in this process against real Docker; the other party's move is
injected right after the real container is created, the moment the race leaves open."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import Attempt, Phase, TaskRun, TrainingJob
from jobs.runtime import decide, docker_hosts, schedule, start, stop
from tests.helpers import BUSYBOX
from tests.pytest_env import TEST_LABEL

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


def test_a_start_behind_another_start_of_a_stopped_attempt_stops_what_it_started(demo, docker_client, monkeypatch):
    """Two starts of one attempt (reconcile queues another when the first seems stuck) and the
    user's Stop between them: the other start broke on the Stop and moved the attempt to running;
    the stop task found no container yet (this start was still creating it) and ended the attempt
    and the job. This start then started its container and marked the instance running under an
    ended attempt, which no follower takes: before, the container ran on. A Stop leaves no next
    attempt, so this start stops what it started and ends the instance."""
    job, attempt = _job_and_attempt(demo)
    create_and_start = start._create_and_start
    seen = []

    def the_other_start_and_the_stop_meanwhile(*args):
        Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.RUNNING, started_at=timezone.now())
        _stop_requested(job)
        assert stop.stop_job(job.id) is True  # nothing to stop yet; it ends the attempt and the job
        container = create_and_start(*args)
        seen.append(container.id)
        return container

    monkeypatch.setattr(start, "_create_and_start", the_other_start_and_the_stop_meanwhile)
    try:
        assert start.start_attempt(attempt.id) is False
        assert seen, "the start created no container: the race was not reached"
        assert TrainingJob.objects.get(id=job.id).phase == Phase.TERMINATED
        assert docker_client.containers.get(seen[0]).status == "exited"
        run = TaskRun.objects.get(attempt=attempt)
        assert run.state == TaskRun.State.EXITED and "Stopped while" in run.error
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


# A job that ends at once on SIGTERM: a busybox sleep as PID 1 would ignore it for the stop's 5 s.
TERM_ENDS_IT = ["sh", "-c", "trap 'exit 0' TERM; sleep 300 & wait"]


def _live_container(docker_client, job):
    return docker_client.containers.run(
        BUSYBOX,
        TERM_ENDS_IT,
        detach=True,
        network_mode="none",
        labels={TEST_LABEL[0]: TEST_LABEL[1], "console.job": str(job.id)},
    )


def _ended_in_its_container(attempt: Attempt, container_id: str, **run_fields) -> TaskRun:
    """The attempt ran in `container_id` and its command ended while the container lived on."""
    now = timezone.now()
    TaskRun.objects.filter(attempt=attempt).update(
        state=TaskRun.State.EXITED,
        container_id=container_id,
        started_at=now,
        ended_at=now,
        ended_in_place=True,
        **run_fields,
    )
    Attempt.objects.filter(id=attempt.id).update(
        state=Attempt.State.ENDED, outcome=Attempt.Outcome.FAILED, started_at=now, ended_at=now
    )
    return TaskRun.objects.get(attempt=attempt)


def _stop_requested(job) -> None:
    """The user's Stop, as request_terminate records it (its task is called by the test)."""
    TrainingJob.objects.filter(id=job.id).update(
        terminate_requested=True, terminate_requested_at=timezone.now(), phase=Phase.TERMINATING
    )


def test_a_stop_while_a_restart_in_place_starts_stops_the_container_it_reuses(demo, docker_client):
    """A process-level restart reuses the live container: its run stays "created" until the start
    gives the go. The Stop's task stopped nothing for an attempt whose runs were all "created",
    then ended it and the job Terminated; the start found the attempt ended and left, and the
    container ran on, followed for good by the run before's follower."""
    job, first = _job_and_attempt(demo)
    container = _live_container(docker_client, job)
    try:
        run = _ended_in_its_container(first, container.id, exit_code=1)
        restart = schedule.new_attempt(job, [demo.host], "process", reuse={0: run})  # its start is not run
        _stop_requested(job)
        assert stop.stop_job(job.id) is True
        container.reload()
        assert container.status == "exited"
        assert TrainingJob.objects.get(id=job.id).phase == Phase.TERMINATED
        assert Attempt.objects.get(id=restart.id).outcome == Attempt.Outcome.TERMINATED
    finally:
        container.remove(force=True)


def test_the_decision_that_ends_a_stopped_job_stops_a_container_whose_run_hung(demo, docker_client):
    """Hang detection ended the run while its command still runs; the job was being stopped, so
    the decision ends it Terminated and relied on the stop task alone. Had that task met an
    engine error, nothing asked again (the job is final) and the command ran on."""
    job, attempt = _job_and_attempt(demo)
    container = _live_container(docker_client, job)
    try:
        now = timezone.now()
        TaskRun.objects.filter(attempt=attempt).update(
            state=TaskRun.State.EXITED,
            container_id=container.id,
            started_at=now,
            ended_at=now,
            ended_in_place=True,
            hung=True,
        )
        Attempt.objects.filter(id=attempt.id).update(state=Attempt.State.RUNNING, started_at=now)
        _stop_requested(job)  # its stop task's call to the engine failed: nothing was stopped
        assert decide.attempt_may_have_ended(attempt.id) is True
        container.reload()
        assert container.status == "exited"
        assert TrainingJob.objects.get(id=job.id).phase == Phase.TERMINATED
    finally:
        container.remove(force=True)


def test_a_reschedule_that_finds_no_host_stops_the_instances_it_would_have_kept(demo, docker_client):
    """Instance rescheduling (pod_retry_num) moves the lost instance and restarts the others in
    their containers; with no host for the lost one it falls back to a job-level restart in new
    containers (here: none to place it on yet). The decision took "reschedule" as a restart in
    place and stopped nothing: the surviving instance ran on beside the restart, holding its host.
    Now only a next attempt that really reuses the containers keeps them running."""
    from faulttolerance.models import RecoveryRecord
    from jobs.models import DockerHost

    job = TrainingJob(
        workspace=demo.workspace, created_by=demo.owner, name="no-host", image=BUSYBOX, command="sleep 300",
        node_count=2, fault_tolerance=True, max_restarts=2, pod_retry_num=1,
    )  # fmt: skip
    job.full_clean()
    job.save()
    TrainingJob.objects.filter(id=job.id).update(phase=Phase.RUNNING)
    gone = DockerHost.objects.create(name="gone", base_url="unix:///nonexistent/console-test.sock", pool=demo.pool)
    container = _live_container(docker_client, job)
    now = timezone.now()
    attempt = Attempt.objects.create(job=job, number=1, level="initial", state=Attempt.State.RUNNING, started_at=now)
    TaskRun.objects.create(
        attempt=attempt, index=0, host=gone, container_name=docker_hosts.container_name(job, 1, 0),
        state=TaskRun.State.LOST, started_at=now, ended_at=now, error="Docker host gone became unreachable.",
    )  # fmt: skip
    TaskRun.objects.create(
        attempt=attempt, index=1, host=demo.host, container_name=docker_hosts.container_name(job, 1, 1),
        container_id=container.id, state=TaskRun.State.RUNNING, started_at=now,
    )  # fmt: skip
    DockerHost.objects.filter(id=demo.host.id).update(isolated=True)  # no host for the lost instance
    try:
        assert decide.attempt_may_have_ended(attempt.id) is True
        record = RecoveryRecord.objects.get(job=job)
        assert (record.failure_class, record.restart) == ("node_failure", True), record.decision_reason
        assert not TaskRun.objects.filter(attempt__job=job, reuses_container=True).exists()
        container.reload()
        assert container.status == "exited"
    finally:
        container.remove(force=True)


def test_a_container_a_dead_start_left_under_a_stopped_attempt_is_an_orphan(demo, docker_client, settings):
    """The start made and started the container, then its worker died before it marked the instance
    running; the user's Stop found nothing started and ended the attempt and the job. No start runs
    an ended attempt again, so the run stays "created" for good, and the orphan scan took a
    "created" run as one about to start: the container ran on. Now it is an orphan once the
    attempt ended a while ago (settings.ORPHAN_GRACE_S, here 0)."""
    from jobs.runtime import cleanup

    settings.ORPHAN_GRACE_S = 0
    job, attempt = _job_and_attempt(demo)
    run = TaskRun.objects.get(attempt=attempt)
    labels = {"console.managed": "1", "console.job": str(job.id), TEST_LABEL[0]: TEST_LABEL[1]}
    left = docker_client.containers.run(
        BUSYBOX, TERM_ENDS_IT, name=run.container_name, labels=labels, detach=True, network_mode="none"
    )
    try:
        _stop_requested(job)
        assert stop.stop_job(job.id) is True
        assert TrainingJob.objects.get(id=job.id).phase == Phase.TERMINATED
        assert TaskRun.objects.get(id=run.id).state == TaskRun.State.CREATED
        left.reload()
        assert left.status == "running"  # nothing started, as far as the database knows
        assert cleanup.remove_orphaned_containers() is True
        assert not docker_client.containers.list(all=True, sparse=True, filters={"id": left.id})
    finally:
        for container in docker_client.containers.list(all=True, sparse=True, filters={"id": left.id}):
            container.remove(force=True)


def test_a_restart_in_place_whose_job_was_deleted_meanwhile_ends_quietly(demo, docker_client, monkeypatch):
    """The user stopped and deleted the job while its process-level restart was starting: the
    container to restart is gone (the Stop removed it), and so is the job's row. The start ends
    the way every start whose job was deleted ends (False); describing the engine's NotFound does
    not read the job's row, which the start no longer holds (it reads the job's Stop wish only)."""
    job, first = _job_and_attempt(demo)
    container = _live_container(docker_client, job)
    try:
        run = _ended_in_its_container(first, container.id, exit_code=1)
        restart = schedule.new_attempt(job, [demo.host], "process", reuse={0: run})  # its start is run below
        restart_process = start._restart_process
        reached = []

        def stopped_and_deleted_meanwhile(task_run, attempt):
            container.remove(force=True)  # the Stop's removal
            TrainingJob.objects.filter(id=job.id).delete()
            reached.append(task_run.id)
            restart_process(task_run, attempt)  # the real engine's NotFound

        monkeypatch.setattr(start, "_restart_process", stopped_and_deleted_meanwhile)
        assert start.start_attempt(restart.id) is False
        assert reached, "the start did not reach the restart in place: the race was not reached"
        assert not Attempt.objects.filter(id=restart.id).exists()
    finally:
        for leftover in _containers_of(docker_client, job):
            leftover.remove(force=True)
