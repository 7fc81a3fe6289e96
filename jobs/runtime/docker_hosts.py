"""The container spec of a task run (SPEC §8): what engine.create_container is given."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection, transaction

from faulttolerance.launcher import BIND_TARGETS, GO, LAUNCHER, STANDBY_FILES, STANDBY_MARK, check_environment
from jobs.models import Attempt, DockerHost, ResourcePool, TaskRun, TrainingJob

from . import engine, engine_networks, layout, ssh, staging
from .layout import (  # noqa: F401 - part of this API
    CACHE_MOUNT,
    JOB_DATA_MOUNT,
    LayoutEntry,
    instance_hostname,  # defined beside the layout (the ssh config names the instances)
)
from .staging import job_data_dir  # noqa: F401 - part of this API

MA_USER = engine.MA_USER
# Each multi-instance job has a network of its own: the port is the job's, not the host's.
MASTER_PORT = 29500


# A container created ahead of its attempt (standby.py); once its take-over gave it its go it is
# that attempt's container like any other (labels cannot change: the go is in its control dir).
STANDBY_LABEL = "console.standby"
SPEC_LABEL = "console.spec"  # the standby's spec_fingerprint()


def container_name(job: TrainingJob, attempt_number: int, index: int) -> str:
    """The name of instance `index`'s container of attempt `attempt_number` (unique per engine)."""
    return f"tj-{job.id.hex}-a{attempt_number}-w{index}"


def container_labels(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> dict[str, str]:
    labels = {
        settings.CONTAINER_LABEL: "1",
        "console.job": str(job.id),
        "console.attempt": str(attempt.number),
        "console.task": str(task_run.index),
        # Set here, "1" only on a standby: an image's LABEL cannot make a container look like one.
        STANDBY_LABEL: "0",
    }
    labels.update(settings.CONTAINER_EXTRA_LABELS)
    return labels


CONTROL_DIR = engine.CONTROL_MOUNT


def pool_of(host: DockerHost) -> ResourcePool:
    return host.pool or ResourcePool(name="default")  # unsaved: the model's defaults


# Set in every container unless the job sets them itself (a default, not a control variable).
# PYTHONUNBUFFERED: live logs from Python jobs. HOME: the launcher runs as root, the
# command as ma-user, whose home it is.
DEFAULT_ENVIRONMENT = {"PYTHONUNBUFFERED": "1", "HOME": "/home/ma-user"}


# pg_advisory_xact_lock's first key for "making a job's networks" (the second is the job's);
# any constant unique to this purpose (placement.PLACEMENT_LOCK is another).
NETWORKS_LOCK = 7210
_networks_made_here = threading.Lock()


def job_network(job: TrainingJob, attempt_number: int) -> str:
    """A multi-instance job's own Docker network for the containers made for one attempt, on
    each host it runs on. One per attempt, not per job: a restart's new containers take the
    names and, as often as not, the addresses of the old ones, and on one network the engine's
    name table holds (name, address) pairs without a count, torn down asynchronously, so the
    old container's late removal took the new one's entry with it and the new rank's peer
    never resolved (docs/decisions.md "A network per attempt")."""
    return f"console-job-{job.id.hex}-a{attempt_number}"


def network_for(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> str:
    """The network a new container of this attempt joins on its host: the one the containers this
    attempt restarts in on that host are on (a rescheduled instance beside instances that stay
    where they are: as the engine says, whichever attempt made it), else the attempt's own."""
    staying = (
        attempt.task_runs.filter(reuses_container=True, host_id=task_run.host_id)
        .exclude(container_id="")
        .values_list("container_id", flat=True)
        .first()
    )
    if staying:
        try:
            networks = engine.container(task_run.host, staying).attrs["NetworkSettings"]["Networks"] or {}
        except engine.NotFound:
            networks = {}
        for name in networks:
            if name.startswith(f"console-job-{job.id.hex}"):
                return name
    return job_network(job, attempt.number)


@contextmanager
def making_networks(job: TrainingJob) -> Iterator[None]:
    """One start at a time makes or looks up this job's networks: two starts of one attempt (a
    retried start, reconcile's restart_stuck_starts) each made one of the same name, and the
    engine then refused the ambiguous name at a container's create. Every worker: an advisory
    lock on PostgreSQL (for a transaction that holds nothing else); the embedded console on
    SQLite is one process."""
    if connection.vendor != "postgresql":
        with _networks_made_here:
            yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [NETWORKS_LOCK, job.id.int & 0x7FFFFFFF])
        yield


def network_labels(job: TrainingJob, attempt_number: int) -> dict[str, str]:
    """The job's labels (the job's end removes its networks by them: cleanup.py) and the attempt
    the network was made for (a past attempt's goes once its last container has: follow.py)."""
    return staging.volume_labels(job, "network") | {"console.attempt": str(attempt_number)}


def remove_past_networks(job: TrainingJob, host: DockerHost) -> None:
    """Remove this job's networks on this host made for an attempt before the latest one, unless
    a running container is on one (the engine refuses: among them, the network of the containers
    the latest attempt restarts in, which its new containers on that host join). Docker's address
    pools hold about thirty networks: a past attempt's must not wait for the job's end. The latest
    attempt's own network, and any a later attempt made meanwhile, are left alone: a start may be
    joining them (a container made but not started is not on a network yet)."""
    latest = job.attempts.order_by("-number").values_list("number", flat=True).first()
    for network in engine_networks.networks_labelled(host, f"console.job={job.id}"):
        if made_for_a_past_attempt(network.labels, latest):
            engine_networks.remove_network_unless_used(host, network.name)


def made_for_a_past_attempt(labels: dict[str, str], latest: int | None) -> bool:
    """Whether a job's network (its labels, network_labels) was made for an attempt before the
    job's latest, `latest` (None: the job has none yet). The one rule of the follower's removal
    above and of the orphan scan's (cleanup.py)."""
    made_for = labels.get("console.attempt") or "0"
    return latest is not None and made_for.isdigit() and int(made_for) < latest


def peer_hostnames(job: TrainingJob, task_run: TaskRun, hosts: list[DockerHost] | None) -> list[str]:
    """The instance names this instance can reach: those on its own host, which share the
    job's network there. Instances on other hosts share no network with it (a per-host
    bridge; docs/decisions.md), so the dns check does not ask for them."""
    if hosts is None or job.node_count == 1:
        return [instance_hostname(job, i) for i in range(job.node_count)]
    return [instance_hostname(job, i) for i, h in enumerate(hosts) if h.id == task_run.host_id]


def container_environment(
    job: TrainingJob,
    attempt: Attempt,
    task_run: TaskRun,
    runtime: list[LayoutEntry] | None = None,
    hosts: list[DockerHost] | None = None,
) -> dict[str, str]:
    """The container's env: defaults, then the job's own env vars, then the console's.

    The console's variables (MA_*, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    VC_TASK_INDEX) are applied last and so win: the launcher, restarts, rank assignment
    and the environment checks depend on them. Validation already refuses those names in
    a job; this keeps a job saved around validation (admin, old rows) from breaking them.
    """
    runtime = layout.runtime_layout(job) if runtime is None else runtime
    pool = pool_of(task_run.host)
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
        "MA_VOLCANO_HOSTS": " ".join(peer_hostnames(job, task_run, hosts)),
        # SPEC §4/§5: with R = 0 nothing is restarted and no environment check runs.
        **check_environment(fault_tolerant=job.max_restarts_effective > 0, pool=pool, flavor=job.flavor),
        # SPEC §3 "operator re-execution": configuration for the framework (an Ascend feature).
        "MA_OPERATOR_REEXECUTION": "1" if job.operator_reexecution else "0",
        # SPEC §3 "JupyterLab": the launcher starts it (and TensorBoard) on the instance's loopback;
        # the console reaches them through an exec, never a route (jobs/proxy/).
        "MA_JUPYTER_LAB": "1" if job.jupyter_lab else "0",
        "MA_APPS": " ".join(
            app
            for app, on in (("jupyter", job.jupyter_lab), ("tensorboard", job.tensorboard), ("sshd", job.ssh_remote))
            if on
        ),
        "MA_SSH_HOST_KEY": f"{ssh.REMOTE_SSH_DIR}/{ssh.HOST_KEY}",
        "MA_SSHD_PORT": str(ssh.SSHD_PORT),
        # "1" only in a standby (container_create_kwargs): its launcher waits for its go. Set
        # here, so that an image's ENV cannot make a container wait for a go that never comes.
        "MA_STANDBY": "0",
    }
    return {**DEFAULT_ENVIRONMENT, **job.environment_dict(), **control}


def resource_kwargs(job: TrainingJob, pool: ResourcePool | None = None) -> dict:
    """CPU, memory, PIDs and GPU limits of each instance: the custom spec or the flavor; without
    either, the pool's defaults for jobs without a flavor (an operator setting). The PIDs limit
    always applies: a fork bomb stays inside its container."""
    pool = pool or ResourcePool(name="default")
    limits: dict = {"pids_limit": pool.pids_limit}
    spec = job.resource_limits() or {"cpus": pool.default_cpus, "memory_mb": pool.default_memory_mb, "gpus": 0}
    if spec["cpus"]:
        limits["nano_cpus"] = int(spec["cpus"] * 1e9)
    if spec["memory_mb"]:
        # No swap beyond the memory limit: a job over its memory is OOM-killed, as on a real node.
        limits["mem_limit"] = limits["memswap_limit"] = f"{spec['memory_mb']}m"
    if spec["gpus"]:
        limits["device_requests"] = [engine.gpu_request(spec["gpus"])]
    return limits


def container_create_kwargs(
    job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost], *, standby: bool = False
) -> dict:
    """Everything `containers.create` needs for this instance. Prepares the host side of its
    mounts first (the code copy and backup, missing directories): may raise staging.StagingError.
    A standby (standby.py) is made while the attempt before it still runs; it carries the
    fingerprint of its spec, which its take-over compares with spec_now()'s, and its launcher
    waits for the take-over's go (MA_STANDBY=1, beside its control dir's mark: standby.py)."""
    runtime = staging.prepare_sources(job, attempt, task_run, standby=standby)
    control = engine.make_control_dir(job.id, task_run.container_name)
    if job.node_count == 1:
        write_hosts_file(job, task_run)
    spec = _spec(job, attempt, task_run, hosts, runtime, staging.mounts_for(job, attempt, task_run, runtime), control)
    if standby:
        # The fingerprint first: the take-over compares it with what a plain create gives now.
        spec["labels"] = {**spec["labels"], STANDBY_LABEL: "1", SPEC_LABEL: spec_fingerprint(spec)}
        spec["environment"] = {**spec["environment"], "MA_STANDBY": "1"}
    return spec


def bind_sources(spec: dict) -> list[tuple[str, str]]:
    """(target, host source) of each bind mount of a spec, in order."""
    return [(m["Target"], m["Source"]) for m in spec["mounts"] if m.get("Type") == "bind"]


def has_network_volumes(spec: dict) -> bool:
    """Whether a spec mounts an NFS export (a volume the engine mounts at the start): a started
    container holds the export's folder as it was, and nothing here can tell whether it moved."""
    return any(
        (((m.get("VolumeOptions") or {}).get("DriverConfig") or {}).get("Options") or {}).get("type") == "nfs"
        for m in spec["mounts"]
    )


def _mark_standby(job: TrainingJob, task_run: TaskRun, spec: dict, container_id: str) -> None:
    """The control dir of a standby just made: its mark, the bind targets its launcher is asked
    about, and nothing an earlier container of this name left (a go would start its job). Only
    once the create succeeded: a create that lost the name (409) must not touch the dir of the
    container that holds it. The mark, written last, names the container: a take-over gives its
    go only after this container's mark (standby._marked), never before the clearing."""
    name = task_run.container_name
    for stale in (GO, *STANDBY_FILES):
        engine.remove_control_file(job.id, name, stale)
    engine.write_control_file(job.id, name, BIND_TARGETS, "".join(f"{target}\n" for target, _ in bind_sources(spec)))
    engine.write_control_file(job.id, name, STANDBY_MARK, standby_mark_text(container_id))


def standby_mark_text(container_id: str) -> str:
    return f"waiting for its go: {container_id}\n"


# The /etc/hosts of a single instance (networking disabled: Docker writes none), in its control dir.
HOSTS_FILE = "hosts"


def hosts_text(hostname: str) -> str:
    """What Docker writes for a container on the "none" network, and the container's own name."""
    return (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "fe00::0\tip6-localnet\n"
        "ff00::0\tip6-mcastprefix\n"
        "ff02::1\tip6-allnodes\n"
        "ff02::2\tip6-allrouters\n"
        f"127.0.0.1\t{hostname}\n"
    )


def write_hosts_file(job: TrainingJob, task_run: TaskRun) -> None:
    """Written once: a bind mount holds the file it was started with, and an armed standby's
    take-over asks that each source still be the file its container holds (same inode)."""
    text = hosts_text(instance_hostname(job, task_run.index))
    if engine.read_control_file(job.id, task_run.container_name, HOSTS_FILE) != text:
        # 0644 whatever the worker's umask: the job (uid 1000) reads it, as Docker's own.
        engine.write_control_file(job.id, task_run.container_name, HOSTS_FILE, text, mode=0o644)


def spec_now(job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost]) -> dict:
    """The spec create would give this instance now, staging nothing: every bind source confined
    and every grant asked again (staging.recheck_sources). Raises staging.StagingError."""
    runtime = layout.runtime_layout(job)
    mounts = staging.recheck_sources(job, attempt, task_run, runtime)
    return _spec(job, attempt, task_run, hosts, runtime, mounts, engine.control_dir(job.id, task_run.container_name))


def spec_fingerprint(spec: dict) -> str:
    """What a spec asks of Docker, but its labels (a standby's add two), as one digest."""
    asked = {key: value for key, value in spec.items() if key != "labels"}
    return hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()


def _spec(
    job: TrainingJob,
    attempt: Attempt,
    task_run: TaskRun,
    hosts: list[DockerHost],
    runtime: list[LayoutEntry],
    mounts: list,
    control,
) -> dict:
    pool = pool_of(task_run.host)
    multi = job.node_count > 1
    flavor = job.flavor
    shm_gb = flavor.shm_size_gb if flavor and flavor.shm_size_gb else pool.shm_size_gb
    return {
        **resource_kwargs(job, pool),
        "image": job.image,
        # PID 1 is the console's launcher on the console's own busybox, as root: it runs the
        # environment checks and reports exits where the job cannot write (engine.py), and
        # runs the user's command as ma-user.
        "command": [engine.BUSYBOX, "sh", "-c", LAUNCHER, "launcher"],
        "entrypoint": [],
        "name": task_run.container_name,
        "hostname": instance_hostname(job, task_run.index),
        "labels": container_labels(job, attempt, task_run),
        "environment": container_environment(job, attempt, task_run, runtime, hosts),
        "user": engine.ROOT_USER,
        # No route anywhere: one instance has no network; the instances of a multi-instance job
        # share an internal network of their own on each host (no address of the host on it,
        # so nothing of the host answers), never the host's network (SPEC §8).
        "network": network_for(job, attempt, task_run) if multi else "none",
        # One instance: networking disabled, not Docker's "none" network. The kernel gives it the
        # same empty network namespace (its loopback only), but the engine makes no sandbox for
        # it, so none is torn down at its exit: Debian's Docker 20.10 deadlocks in that tear-down
        # when many containers exit at once (moby/moby#46661), and a start is ~65 ms shorter.
        # Docker then writes no /etc/hosts: HOSTS_FILE, bound below, is the one it would write,
        # with the container's own name on its loopback.
        "network_disabled": not multi,
        "shm_size": f"{int(shm_gb * 1024)}m",
        # The job data dir, /cache, the local code dir, datasets, artifacts, mounts, the summary
        # and SSH dirs: the same list the create wizard previews (layout.runtime_layout); then
        # the console's tools (read-only) and the container's control dir.
        "mounts": [
            *mounts,
            engine.bind_mount(engine.TOOLS_MOUNT, str(engine.runtime_tools_dir()), read_only=True),
            engine.bind_mount(engine.CONTROL_MOUNT, str(control)),
            *([] if multi else [engine.bind_mount("/etc/hosts", str(control / HOSTS_FILE), read_only=True)]),
        ],
        # Root's: the launcher writes the instance host names there; the job only reads them.
        "tmpfs": {"/etc/volcano": "mode=755,size=64k"},
        "security_opt": ["no-new-privileges"],
        # No HEALTHCHECK of the image: Docker runs it as the container's user, root here (the
        # launcher's), where it could write the control dir (forge a report, a standby's go).
        "healthcheck": {"test": ["NONE"]},
        # IPv4 only: no link-local IPv6 route to whatever the host serves on "::".
        "sysctls": {"net.ipv6.conf.all.disable_ipv6": "1"},
        # The local driver keeps every byte the job prints (json-file replaces invalid UTF-8)
        # and bounds what a host keeps: the console persists the log as it comes.
        "log_config": engine.local_log_config(max_size="64m", max_files=4),
        "detach": True,
    }


def create_container(
    job: TrainingJob, attempt: Attempt, task_run: TaskRun, hosts: list[DockerHost], *, standby: bool = False
):
    """Create (not start) this instance's container on its host; on the job's network (made
    first, engine_networks.ensure_internal_network), the other instances know it by its host name."""
    spec = container_create_kwargs(job, attempt, task_run, hosts, standby=standby)
    if spec["network"] != "none":
        with making_networks(job):
            network_id = engine_networks.ensure_internal_network(
                task_run.host, spec["network"], network_labels(job, attempt.number)
            )
        spec = spec | {"network": network_id}
    container = engine.create_container(task_run.host, spec, network_alias=instance_hostname(job, task_run.index))
    if standby:
        _mark_standby(job, task_run, spec, container.id)
    return container
