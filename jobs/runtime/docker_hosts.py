"""Docker clients per host and the container spec of a task run (SPEC §8)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import docker
from django.conf import settings

from jobs.models import Attempt, DockerHost, ResourcePool, TaskRun, TrainingJob

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


LAUNCHER = "\n".join(
    line for line in (Path(__file__).with_name("launcher.sh")).read_text().splitlines() if not line.startswith("#")
)
CONTROL_DIR = "/tmp/.console"
JOB_DATA_MOUNT = "/job-data"
CACHE_MOUNT = "/cache"


def pool_of(host: DockerHost) -> ResourcePool:
    return host.pool or ResourcePool(name="default")  # unsaved: the model's defaults


def instance_hostname(job: TrainingJob, index: int) -> str:
    return f"{job.name.lower().replace('_', '-')}-worker-{index}"


def job_data_dir(job: TrainingJob) -> Path:
    """The job-scoped persistent directory (SPEC §8) on the hosts' shared storage."""
    path = Path(settings.JOB_DATA_ROOT) / str(job.id)
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, 1000, 1000)  # the job runs as ma-user
    return path


def container_environment(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> dict[str, str]:
    pool = pool_of(task_run.host)
    fault_tolerant = job.max_restarts_effective > 0
    env = {
        "PYTHONUNBUFFERED": "1",  # live logs from Python jobs
        "MA_USER_COMMAND": job.command,
        "MA_JOB_ID": str(job.id),
        "MA_JOB_NAME": job.name,
        "MA_JOB_DIR": DEFAULT_LOCAL_CODE_DIR,
        "MA_TASK_NAME": task_run.task_name,
        "VC_TASK_INDEX": str(task_run.index),
        "RANK": str(task_run.index),
        "WORLD_SIZE": str(job.node_count),
        "MASTER_ADDR": instance_hostname(job, 0),
        "MASTER_PORT": str(MASTER_PORT),
        "MA_ATTEMPT": str(attempt.number),
        "MA_RESTART_COUNT": str(attempt.number - 1),
        "MA_JOB_DATA_DIR": JOB_DATA_MOUNT,
        "MA_CHECKPOINT_DIR": JOB_DATA_MOUNT,
        "MA_CONTROL_DIR": CONTROL_DIR,
        # The launcher writes these into /etc/volcano/<job>.host for the dns check.
        "MA_VOLCANO_HOSTS": " ".join(instance_hostname(job, i) for i in range(job.node_count)),
        # SPEC §4/§5: with R = 0 nothing is restarted and no environment check runs.
        "MA_PROCESS_RESTART": "1" if fault_tolerant else "0",
        "MA_ENV_CHECKS": "1" if fault_tolerant else "0",
        "MA_CHECK_ROOT_GB": str(pool.check_root_gb),
        "MA_CHECK_SHM_GB": str(pool.check_shm_gb),
        "MA_CHECK_CACHE_GB": str(pool.check_cache_gb),
        "MA_CHECK_ULIMIT": "1" if job.flavor and job.flavor.uses_ib else "0",
        "MA_CHECK_GPU": "1" if job.flavor and job.flavor.gpus else "0",
        "MA_CHECK_ULIMIT_MEMLOCK": str(pool.check_ulimit_memlock),
        "MA_CHECK_ULIMIT_NOFILE": str(pool.check_ulimit_nofile),
        "MA_CHECK_ULIMIT_STACK": str(pool.check_ulimit_stack),
        "MA_CHECK_ULIMIT_NPROC": str(pool.check_ulimit_nproc),
    }
    return env


def container_create_kwargs(job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost]) -> dict:
    pool = pool_of(task_run.host)
    multi = job.node_count > 1
    flavor = job.flavor
    shm_gb = flavor.shm_size_gb if flavor and flavor.shm_size_gb else pool.shm_size_gb
    limits = {}
    if flavor is not None:
        limits = {"mem_limit": f"{flavor.memory_mb}m", "memswap_limit": f"{flavor.memory_mb}m"}
        limits["nano_cpus"] = int(flavor.cpus * 1e9)
        if flavor.gpus:
            limits["device_requests"] = [docker.types.DeviceRequest(count=flavor.gpus, capabilities=[["gpu"]])]
    return {
        **limits,
        "image": job.image,
        "command": ["sh", "-c", LAUNCHER, "launcher"],
        "name": task_run.container_name,
        # Docker refuses a hostname with host networking; the names resolve through extra_hosts.
        "hostname": None if multi else instance_hostname(job, task_run.index),
        "labels": container_labels(job, attempt, task_run),
        "environment": container_environment(job, attempt, task_run),
        "user": MA_USER,
        # Never a bridge to private addresses: isolated, or the hosts' own
        # network for the ranks of a multi-instance job.
        "network_mode": "host" if multi else "none",
        "extra_hosts": {instance_hostname(job, i): h.address for i, h in enumerate(hosts)},
        "shm_size": f"{int(shm_gb * 1024)}m",
        "volumes": {
            str(job_data_dir(job)): {"bind": JOB_DATA_MOUNT, "mode": "rw"},
            # A per-instance scratch volume, created on the instance's host.
            f"console-cache-{job.id.hex[:12]}-{task_run.index}": {"bind": CACHE_MOUNT, "mode": "rw"},
        },
        # Writable by ma-user, so the launcher can write the host file (no put_archive round trip).
        "tmpfs": {"/etc/volcano": "uid=1000,gid=1000,mode=755,size=64k"},
        "security_opt": ["no-new-privileges"],
        "detach": True,
    }
