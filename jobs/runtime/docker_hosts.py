"""Docker clients per host and the container spec of a task run (SPEC §8)."""

from __future__ import annotations

import io
import tarfile
import threading
from pathlib import Path

import docker
from django.conf import settings

from jobs.models import Attempt, DockerHost, ResourcePool, TaskRun, TrainingJob

from . import layout
from .layout import (  # noqa: F401 - part of this API
    CACHE_MOUNT,
    JOB_DATA_MOUNT,
    LayoutEntry,
    instance_hostname,  # defined beside the layout (the ssh config names the instances)
    job_data_dir,
)

MA_USER = "1000:1000"
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


def pool_of(host: DockerHost) -> ResourcePool:
    return host.pool or ResourcePool(name="default")  # unsaved: the model's defaults


# Set in every container unless the job sets them itself (a default, not a control variable).
DEFAULT_ENVIRONMENT = {"PYTHONUNBUFFERED": "1"}  # live logs from Python jobs


def container_environment(
    job: TrainingJob, attempt: Attempt, task_run: TaskRun, runtime: list[LayoutEntry] | None = None
) -> dict[str, str]:
    """The container's env: defaults, then the job's own env vars, then the console's.

    The console's variables (MA_*, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    VC_TASK_INDEX) are applied last and so win: the launcher, restarts, rank assignment
    and the environment checks depend on them. Validation already refuses those names in
    a job; this keeps a job saved around validation (admin, old rows) from breaking them.
    """
    runtime = layout.runtime_layout(job) if runtime is None else runtime
    pool = pool_of(task_run.host)
    fault_tolerant = job.max_restarts_effective > 0
    control = {
        "MA_USER_COMMAND": job.command,
        "MA_JOB_ID": str(job.id),
        "MA_JOB_NAME": job.name,
        # MA_JOB_DIR, MA_CODE_DIR, MA_DATASET_*, MA_ARTIFACT_DIR, MA_SUMMARY_DIR
        **layout.layout_environment(job, runtime),
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
        # SPEC §3 "operator re-execution": configuration for the framework (an Ascend feature).
        "MA_OPERATOR_REEXECUTION": "1" if job.operator_reexecution else "0",
        # SPEC §3 "JupyterLab": a flag for the image only. The console starts no JupyterLab and
        # could not route to one (no network out of a job, SPEC §8).
        "MA_JUPYTER_LAB": "1" if job.jupyter_lab else "0",
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
    return {**DEFAULT_ENVIRONMENT, **job.environment_dict(), **control}


def resource_kwargs(job: TrainingJob) -> dict:
    """CPU, memory and GPU limits of each instance: the custom spec or the flavor; none without either."""
    spec = job.resource_limits()
    if not spec:
        return {}
    limits: dict = {}
    if spec["cpus"]:
        limits["nano_cpus"] = int(spec["cpus"] * 1e9)
    if spec["memory_mb"]:
        # No swap beyond the memory limit: a job over its memory is OOM-killed, as on a real node.
        limits["mem_limit"] = limits["memswap_limit"] = f"{spec['memory_mb']}m"
    if spec["gpus"]:
        limits["device_requests"] = [docker.types.DeviceRequest(count=spec["gpus"], capabilities=[["gpu"]])]
    return limits


def container_create_kwargs(job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost]) -> dict:
    """Everything `containers.create` needs for this instance. Prepares the host side of its
    mounts first (the code copy and backup, missing directories): may raise layout.StagingError."""
    pool = pool_of(task_run.host)
    multi = job.node_count > 1
    flavor = job.flavor
    shm_gb = flavor.shm_size_gb if flavor and flavor.shm_size_gb else pool.shm_size_gb
    runtime = layout.prepare_sources(job, attempt, task_run)
    return {
        **resource_kwargs(job),
        "image": job.image,
        "command": ["sh", "-c", LAUNCHER, "launcher"],
        "name": task_run.container_name,
        # Docker refuses a hostname with host networking; the names resolve through extra_hosts.
        "hostname": None if multi else instance_hostname(job, task_run.index),
        "labels": container_labels(job, attempt, task_run),
        "environment": container_environment(job, attempt, task_run, runtime),
        "user": MA_USER,
        # Never a bridge to private addresses: isolated, or the hosts' own
        # network for the ranks of a multi-instance job.
        "network_mode": "host" if multi else "none",
        "extra_hosts": {instance_hostname(job, i): h.address for i, h in enumerate(hosts)},
        "shm_size": f"{int(shm_gb * 1024)}m",
        # The job data dir, /cache, the local code dir, datasets, artifacts, mounts, the summary
        # and SSH dirs: the same list the create wizard previews (layout.runtime_layout).
        "mounts": layout.mounts_for(job, attempt, task_run, runtime),
        # Writable by ma-user, so the launcher can write the host file (no put_archive round trip).
        "tmpfs": {"/etc/volcano": "uid=1000,gid=1000,mode=755,size=64k"},
        "security_opt": ["no-new-privileges"],
        "detach": True,
    }


def _owned_dir_tar(name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        entry = tarfile.TarInfo(name)
        entry.type, entry.mode, entry.uid, entry.gid = tarfile.DIRTYPE, 0o755, layout.MA_UID, layout.MA_GID
        tar.addfile(entry)
    return buf.getvalue()


# /cache as a directory of ma-user, extracted at / over the volume's root.
_CACHE_OWNED_BY_MA_USER = _owned_dir_tar(CACHE_MOUNT.strip("/"))


def create_container(
    client: docker.DockerClient, job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost]
) -> docker.models.containers.Container:
    """Create (not start) this instance's container, with its /cache writable by ma-user.

    A fresh named volume's root is root's (0755) and the job, uid 1000 with
    no-new-privileges, cannot change that. Docker mounts a created container's volumes
    for an archive upload, so extracting a directory entry owned by 1000 at /cache hands
    the volume's root to ma-user before the first start: one API call, no helper container.
    """
    container = client.containers.create(**container_create_kwargs(job, attempt, task_run, hosts))
    container.put_archive("/", _CACHE_OWNED_BY_MA_USER)
    return container
