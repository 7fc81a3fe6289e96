"""A start in flight whose job is gone when it ends (stopped, then deleted, while the start was
still creating containers) removes the containers it made: no row is left to find them by, and
reconcile leaves a container no task run knows alone for ten minutes (jobs/runtime/start.py).

The supervisor's own start runs in this process against real Docker; the deletion is injected
right after the real container is created, the moment the race leaves open."""

from __future__ import annotations

import pytest

from jobs.models import TrainingJob
from jobs.runtime import docker_hosts, schedule, start
from tests.conftest import BUSYBOX, TEST_LABEL

pytestmark = [pytest.mark.django_db]


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
