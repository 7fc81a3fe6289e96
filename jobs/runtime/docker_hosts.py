"""Docker clients per host and the container spec of a task run (SPEC §8)."""

from __future__ import annotations

import threading

import docker
from django.conf import settings

from jobs.models import Attempt, DockerHost, TaskRun, TrainingJob

MA_USER = "1000:1000"
DEFAULT_LOCAL_CODE_DIR = "/home/ma-user/modelarts/user-job-dir"
MASTER_PORT = 29500

_local = threading.local()


def client_for(host: DockerHost, *, timeout: int = 30) -> docker.DockerClient:
    """A client per thread and host: requests sessions are not shared across threads."""
    clients = getattr(_local, "clients", None)
    if clients is None:
        clients = _local.clients = {}
    key = (host.base_url, timeout)
    if key not in clients:
        clients[key] = docker.DockerClient(base_url=host.base_url, timeout=timeout, version="auto")
    return clients[key]


def forget_client(host: DockerHost) -> None:
    clients = getattr(_local, "clients", {})
    for key in [k for k in clients if k[0] == host.base_url]:
        clients.pop(key).close()


def container_labels(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> dict[str, str]:
    labels = {
        settings.CONTAINER_LABEL: "1",
        "console.job": str(job.id),
        "console.attempt": str(attempt.number),
        "console.task": str(task_run.index),
    }
    labels.update(settings.CONTAINER_EXTRA_LABELS)
    return labels


def container_environment(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> dict[str, str]:
    return {
        "PYTHONUNBUFFERED": "1",  # live logs from Python jobs
        "MA_JOB_ID": str(job.id),
        "MA_JOB_NAME": job.name,
        "MA_JOB_DIR": DEFAULT_LOCAL_CODE_DIR,
        "MA_TASK_NAME": task_run.task_name,
        "VC_TASK_INDEX": str(task_run.index),
        "RANK": str(task_run.index),
        "WORLD_SIZE": str(job.node_count),
        # Multi-instance jobs run with host networking on the operator's hosts.
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(MASTER_PORT),
        "MA_ATTEMPT": str(attempt.number),
        "MA_RESTART_COUNT": str(attempt.number - 1),
    }


def container_create_kwargs(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> dict:
    return {
        "image": job.image,
        "command": ["sh", "-c", job.command],
        "name": task_run.container_name,
        "labels": container_labels(job, attempt, task_run),
        "environment": container_environment(job, attempt, task_run),
        "user": MA_USER,
        # Never a bridge to private addresses: isolated, or the host's loopback
        # for the ranks of a multi-instance job.
        "network_mode": "host" if job.node_count > 1 else "none",
        "shm_size": "1g",
        "security_opt": ["no-new-privileges"],
        "detach": True,
    }
