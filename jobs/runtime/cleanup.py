"""What an ended job leaves on its hosts, removed once nothing of it runs any more:
the per-instance /cache volumes, the NFS mount volumes (both found by their labels,
jobs/runtime/layout.py::volume_labels), the code copies bound at MA_JOB_DIR and the
SSH dir (jobs/runtime/ssh.py: the job's private key must not outlive it).

The job data dir (/job-data, MA_CHECKPOINT_DIR), the object storage folders and the
TensorBoard / MindStudio Insight summary folder stay: they are the user's (checkpoints,
artifacts, summaries)."""

from __future__ import annotations

import logging
import shutil

import docker
from django.conf import settings
from django.utils import timezone

from jobs.models import RETAINED_PHASES, DockerHost, TaskRun, TrainingJob

from . import docker_hosts, ssh
from .layout import LOCAL_CODE_STAGING

log = logging.getLogger(__name__)

# After the end, the follower drains the log and removes the containers; give it this long.
AFTER_END_S = 10
BATCH = 20


def release_job_resources(job_id) -> bool:
    """Remove an ended job's volumes, code copies and SSH files; True once all are gone (the job is then
    marked, so this runs until it succeeds and never again). A host that cannot be reached,
    or a container of the job still there, leaves the job for the next pass."""
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or not job.is_final or job.phase in RETAINED_PHASES or job.resources_released_at:
        return False
    host_ids = set(TaskRun.objects.filter(attempt__job=job).values_list("host_id", flat=True))
    done = True
    for host in DockerHost.objects.filter(id__in=host_ids):
        # An isolated or disabled host is not called (it may not answer): its share waits.
        done &= host.enabled and not host.isolated and _release_on_host(job, host)
    if done:
        shutil.rmtree(_code_copies(job), ignore_errors=True)
        shutil.rmtree(ssh.ssh_dir_path(job), ignore_errors=True)
        TrainingJob.objects.filter(id=job.id, resources_released_at__isnull=True).update(
            resources_released_at=timezone.now()
        )
    return done


def _release_on_host(job: TrainingJob, host: DockerHost) -> bool:
    label = f"console.job={job.id}"
    try:
        client = docker_hosts.client_for(host)
        if client.containers.list(all=True, sparse=True, filters={"label": label}):
            return False  # still being drained or removed; volumes in use cannot go
        for volume in client.volumes.list(filters={"label": label}):
            volume.remove(force=True)
    except (docker.errors.DockerException, OSError) as exc:
        log.info("resources of %s on %s stay for now: %s", job.id, host.name, exc)
        return False
    return True


def _code_copies(job: TrainingJob):
    from pathlib import Path

    return Path(settings.JOB_DATA_ROOT) / LOCAL_CODE_STAGING / str(job.id)


def release_ended_jobs() -> bool:
    """Reconcile step: ended jobs whose hosts still hold their volumes or code copies."""
    cutoff = timezone.now() - timezone.timedelta(seconds=AFTER_END_S)
    ids = list(
        TrainingJob.objects.filter(resources_released_at__isnull=True, ended_at__lt=cutoff)
        .exclude(phase__in=RETAINED_PHASES)
        .order_by("ended_at")
        .values_list("id", flat=True)[:BATCH]
    )
    from jobs import tasks

    for job_id in ids:
        tasks.release_job_resources.delay(str(job_id))
    return bool(ids)
