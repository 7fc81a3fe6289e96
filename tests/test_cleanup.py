"""What an ended job leaves on its host is removed (jobs/runtime/cleanup.py): its /cache
volumes and code copies go, its job data (checkpoints) stays. Real worker and Docker."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from django.utils import timezone

from jobs.models import Phase, TrainingJob
from jobs.runtime import cleanup
from jobs.runtime.layout import LOCAL_CODE_STAGING
from jobs.runtime.staging import job_data_dir
from tests.helpers import BUSYBOX, api_client, build_image, ended, running_instance, submit_job, wait_for
from tests.pytest_env import TEST_LABEL

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


def test_a_past_attempts_network_left_behind_is_removed_by_the_scan(demo, docker_client):
    """The follower's clear-up removes a past attempt's network (test_multi_instance.py); one it
    left (its removal failed, a start failed after making it) is removed by the orphan scan while
    the job runs on. Not the latest attempt's, which its instances are on, and not a network of a
    job this console does not know."""
    import uuid

    from jobs.models import TaskRun
    from jobs.runtime import docker_hosts, engine_networks

    job = submit_job(demo, name="nets", node_count=2, command="sleep 300")
    wait_for(
        lambda: TaskRun.objects.filter(attempt__job=job, state=TaskRun.State.RUNNING).count() == 2,
        message="both instances running",
    )
    left = f"console-job-{job.id.hex}-a0"
    engine_networks.ensure_internal_network(demo.host, left, docker_hosts.network_labels(job, 0))
    stranger = TrainingJob(id=uuid.uuid4())
    unknown = docker_hosts.job_network(stranger, 1)
    engine_networks.ensure_internal_network(demo.host, unknown, docker_hosts.network_labels(stranger, 1))
    try:
        # The suite's worker scans too (reconcile, every ORPHAN_SCAN_EVERY_S): its scan may have
        # removed the network first, so what this call returns is not the test; what is left is.
        cleanup.remove_orphaned_containers([demo.host])
        names = {n.name for n in docker_client.networks.list(filters={"label": "console.volume=network"})}
        assert left not in names
        assert {docker_hosts.job_network(job, 1), unknown} <= names
    finally:
        docker_client.networks.get(unknown).remove()


def test_a_job_deleted_before_its_release_leaves_no_key_network_or_volume(demo, docker_client, monkeypatch, settings):
    """Deleted within seconds of its end (or while a host was away), a job's release never runs:
    no row is left to find its things by. Its files on the console's disk go with the delete
    (the API's here; the admin's too: one signal), and the orphan scan removes its networks and
    volumes once they are as old as an unknown container must be (UNKNOWN_GRACE_S): a network
    left for good takes one of the engine's ~30 address pools."""

    from jobs.runtime import control, ssh

    job = submit_job(demo, name="gone", node_count=2, command="echo done")
    label = {"label": f"console.job={job.id}"}
    wait_for(lambda: TrainingJob.objects.get(id=job.id).phase == Phase.COMPLETED, message="the job to complete")
    # The release has not run yet (it waits AFTER_END_S after the end); keep it from running.
    TrainingJob.objects.filter(id=job.id).update(resources_released_at=timezone.now())
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters=label),
        message="the followers to remove the containers",
    )
    networks = docker_client.networks.list(filters=label)
    volumes = docker_client.volumes.list(filters=label)
    assert networks and volumes, "a two-instance job has a network and /cache volumes"
    kept = [
        ssh.ssh_dir_path(job),
        Path(settings.JOB_DATA_ROOT) / LOCAL_CODE_STAGING / str(job.id),
        control.control_root() / str(job.id),
    ]
    for folder in kept:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "left").write_text("x")

    api = api_client(demo.token)
    response = api.delete(f"/v2/{demo.workspace.project_id}/training-jobs/{job.id}")
    assert response.status_code == 204, response.content
    assert [folder for folder in kept if folder.exists()] == [], "the deleted job's key and copies are gone"
    assert job_data_dir(job).is_dir(), "its job data is the user's"

    assert not cleanup.remove_orphaned_containers([demo.host]), "fresh: left alone, as an unknown container"
    assert docker_client.networks.list(filters=label) and docker_client.volumes.list(filters=label)
    monkeypatch.setattr(cleanup, "UNKNOWN_GRACE_S", 0)
    assert cleanup.remove_orphaned_containers([demo.host])
    assert docker_client.networks.list(filters=label) == []
    assert docker_client.volumes.list(filters=label) == []


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
        # The hosts, then the runs of every container (and the latest attempts of the jobs whose
        # networks are on the host, when another test's job left one there).
        assert queries_with(1) == queries_with(5) in (2, 3)
        assert all(docker_client.containers.get(c.id) for c in made), "unknown and new: left alone"
    finally:
        for container in made:
            container.remove(force=True)


def test_one_worker_at_a_time_scans_a_host_for_orphans_and_only_when_due(demo, settings):
    """The scan lists every container of a host (400 with 200 instances and their standbys):
    reconcile runs every few seconds in every worker, so a host's scan is claimed, by one of
    them, once per ORPHAN_SCAN_EVERY_S (its row's time moved by a conditional UPDATE). The
    worker running beside this test scans every 15 s: the times set here are due only for this
    process (5 s), so it cannot claim one in between."""
    from django.utils import timezone

    from jobs.models import DockerHost

    settings.ORPHAN_SCAN_EVERY_S = 5
    hosts = DockerHost.objects.filter(enabled=True, isolated=False)
    assert hosts.exists()
    ten_s_ago = timezone.now() - timezone.timedelta(seconds=10)
    hosts.update(orphans_scanned_at=ten_s_ago)

    claimed = cleanup.claim_orphan_scans()
    assert sorted(h.id for h in claimed) == sorted(hosts.values_list("id", flat=True))
    assert all(h.orphans_scanned_at > ten_s_ago for h in hosts.all()), "the claim is the scan's time"
    assert cleanup.claim_orphan_scans() == [], "claimed: not due again for ORPHAN_SCAN_EVERY_S"
    assert not cleanup.scan_for_orphans_when_due(), "the reconcile step scans nothing meanwhile"

    # Two workers that read the same due time: the first moves it, the second's UPDATE matches
    # no row any more.
    host = hosts.first()
    DockerHost.objects.filter(id=host.id).update(orphans_scanned_at=ten_s_ago)
    stale = DockerHost.objects.get(id=host.id)
    assert [h.id for h in cleanup.claim_orphan_scans()] == [host.id]
    moved = DockerHost.objects.filter(id=host.id, orphans_scanned_at=stale.orphans_scanned_at).update(
        orphans_scanned_at=timezone.now()
    )
    assert moved == 0, "the second worker's claim finds the time moved"


def test_the_volume_an_image_declares_goes_with_the_container(demo, docker_client):
    """A job's image declares `VOLUME /scratch`: Docker makes an anonymous volume for each of its
    containers, which carries none of the console's labels. It is removed with its container, so a
    job that fills it and ends, attempt after attempt, leaves nothing on the shared host."""
    tag = f"console-test/volume-{TEST_LABEL[1]}:latest"
    build_image(docker_client, tag, f"FROM {BUSYBOX}\nVOLUME /scratch\n")
    try:
        # It ends when the test says so: seen running however slow the machine.
        command = "echo filled > /scratch/f; while [ ! -e /tmp/go ]; do sleep 0.1; done"
        job = submit_job(demo, name="scratch", image=tag, command=command)
        container = docker_client.containers.get(running_instance(job).container_id)
        scratch = [m["Name"] for m in container.attrs["Mounts"] if m["Destination"] == "/scratch"]
        assert len(scratch) == 1 and docker_client.volumes.get(scratch[0])
        assert container.exec_run(["touch", "/tmp/go"], user="1000:1000").exit_code == 0
        wait_for(lambda: ended(job), message="the job to end")
        wait_for(
            lambda: not docker_client.containers.list(all=True, sparse=True, filters={"id": container.id}),
            message="its container to be removed",
        )
        with pytest.raises(docker.errors.NotFound):
            docker_client.volumes.get(scratch[0])
    finally:
        docker_client.images.remove(tag, force=True)
