"""What an ended job leaves on its host is removed (jobs/runtime/cleanup.py): its /cache
volumes and code copies go, its job data (checkpoints) stays. Real worker and Docker."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.models import Phase, TrainingJob
from jobs.runtime import cleanup
from jobs.runtime.layout import LOCAL_CODE_STAGING
from jobs.runtime.staging import job_data_dir
from tests.conftest import BUSYBOX, TEST_LABEL, submit_job, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker")]


def test_an_ended_job_leaves_no_volume_or_code_copy_but_keeps_its_job_data(demo, docker_client, settings):
    bucket = Path(settings.OBJECT_STORAGE_ROOT) / "cleanup-bucket"
    (bucket / "code").mkdir(parents=True, exist_ok=True)
    (bucket / "code" / "run.sh").write_text("echo from the code dir\n")
    job = submit_job(
        demo,
        name="tidy",
        code_dir="obs://cleanup-bucket/code/",
        command="sh ${MA_JOB_DIR}/code/run.sh; echo kept > /job-data/ckpt; echo scratch > /cache/x; sleep 1",
    )
    label = {"label": f"console.job={job.id}"}
    wait_for(lambda: docker_client.volumes.list(filters=label), message="the job's /cache volume")
    copies = Path(settings.JOB_DATA_ROOT) / LOCAL_CODE_STAGING / str(job.id)
    assert copies.is_dir()
    assert not cleanup.release_job_resources(job.id), "nothing is removed while the job runs"

    wait_for(lambda: TrainingJob.objects.get(id=job.id).phase == Phase.COMPLETED, message="the job to complete")
    wait_for(
        lambda: TrainingJob.objects.get(id=job.id).resources_released_at is not None,
        timeout=60,
        message="the reconcile step to release the job's resources",
    )
    assert docker_client.volumes.list(filters=label) == []
    assert not docker_client.containers.list(all=True, sparse=True, filters=label)
    assert not copies.exists()
    assert (job_data_dir(job) / "ckpt").read_text() == "kept\n", "checkpoints are the user's"
    assert not cleanup.release_job_resources(job.id), "done once"


def test_a_container_nobody_removes_is_removed_once_its_instance_ended(demo, docker_client):
    """The follower that should have removed it died (or its host was away): the reconcile step
    removes a container whose instance ended and that nothing follows; not one still running,
    and not one a task run still needs."""
    from django.utils import timezone

    from jobs.models import TaskRun

    job = submit_job(demo, name="orphan", command="echo done")
    wait_for(lambda: TrainingJob.objects.get(id=job.id).phase == Phase.COMPLETED, message="the job to complete")
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job.id}"}),
        message="the follower to remove its container",
    )
    run = TaskRun.objects.get(attempt__job=job)
    labels = {"console.managed": "1", "console.job": str(job.id), **dict([TEST_LABEL])}
    # The container again, as a dead follower would have left it (exited, same name).
    leftover = docker_client.containers.run(BUSYBOX, "true", name=run.container_name, labels=labels, detach=True)
    leftover.wait()
    # Too fresh (created and ended moments ago): a follower may still be draining it.
    TaskRun.objects.filter(id=run.id).update(ended_at=timezone.now())
    assert not cleanup.remove_orphaned_containers()
    TaskRun.objects.filter(id=run.id).update(ended_at=timezone.now() - timezone.timedelta(minutes=5))
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"name": run.container_name}),
        timeout=60,
        message="the reconcile step to remove the orphaned container",
    )


def test_looking_for_orphans_asks_the_database_once_whatever_the_number_of_containers(demo, docker_client, settings):
    """Reconcile lists every container of the console every few seconds: with 200 instances
    running, a query per container made it a fifth of the worker's CPU
    (bench/supervisor_scale.py). Containers no task run knows, made just now: none is removed."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.ORPHAN_GRACE_S = 0
    labels = {"console.managed": "1", **dict([TEST_LABEL])}
    made = []

    def queries_with(count: int) -> int:
        while len(made) < count:
            made.append(docker_client.containers.create(BUSYBOX, "true", labels=labels))
        with CaptureQueriesContext(connection) as queries:
            assert not cleanup.remove_orphaned_containers()
        return len(queries)

    try:
        assert queries_with(1) == queries_with(5) == 2  # the hosts, then the runs of every container
        assert all(docker_client.containers.get(c.id) for c in made), "unknown and new: left alone"
    finally:
        for container in made:
            container.remove(force=True)
