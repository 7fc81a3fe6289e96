"""What an ended job leaves on its hosts, removed once nothing of it runs any more:
the job's networks, the per-instance /cache volumes, the NFS mount volumes (all found by their labels,
jobs/runtime/layout.py::volume_labels), the code copies bound at MA_JOB_DIR and the
SSH dir (jobs/runtime/ssh.py: the job's private key must not outlive it).

The job data dir (/job-data, MA_CHECKPOINT_DIR), the object storage folders and the
TensorBoard / MindStudio Insight summary folder stay: they are the user's (checkpoints,
artifacts, summaries)."""

from __future__ import annotations

import logging
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from django.conf import settings
from django.db.models import Max, Q
from django.utils import timezone

from jobs.models import RETAINED_PHASES, Attempt, DockerHost, TaskRun, TrainingJob

from . import docker_hosts, engine, engine_networks, ssh, standby
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
        engine.remove_control_dirs(job.id)
        TrainingJob.objects.filter(id=job.id, resources_released_at__isnull=True).update(
            resources_released_at=timezone.now()
        )
    return done


def remove_files_of_deleted_job(job_id) -> None:
    """What a deleted job kept on the console's own disk: its code copies, its SSH dir (its private
    key must not outlive it) and its control dirs, once the delete has committed. A job deleted
    before release_job_resources ran (within seconds of its end, or while a host was away) left
    them for good: no row is left to find them by. What its hosts hold (volumes, networks) goes
    with the orphan scan (_remove_left_networks_and_volumes). The job data dir is the user's."""
    shutil.rmtree(Path(settings.JOB_DATA_ROOT) / LOCAL_CODE_STAGING / str(job_id), ignore_errors=True)
    shutil.rmtree(Path(settings.JOB_DATA_ROOT) / ssh.SSH_STAGING / str(job_id), ignore_errors=True)
    engine.remove_control_dirs(job_id)


def _per_job_folders() -> list[Path]:
    """Where the console keeps a folder per job on its own disk, named by the job's id."""
    root = Path(settings.JOB_DATA_ROOT)
    return [root / LOCAL_CODE_STAGING, root / ssh.SSH_STAGING, engine.control_root()]


def remove_files_of_unknown_jobs(changed_before: datetime) -> bool:
    """The per-job folders (_per_job_folders) of jobs no row knows, unchanged since
    `changed_before`: a job deleted while a start still wrote them (the admin deletes only ended
    jobs, but a start's late write is not excluded), or before deletes removed them. Links and
    files are not this console's folders: left alone."""
    found: dict[str, list[Path]] = {}
    for parent in _per_job_folders():
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue  # not made yet
        for entry in entries:
            job = _job_of({"console.job": entry.name})
            try:
                if job is None or not entry.is_dir(follow_symlinks=False):
                    continue
                changed = datetime.fromtimestamp(entry.stat(follow_symlinks=False).st_mtime, tz=UTC)
            except OSError:
                continue  # gone meanwhile
            if changed < changed_before:
                found.setdefault(job, []).append(Path(entry.path))
    ids = sorted(found)
    known = {
        str(job_id)
        for start in range(0, len(ids), 900)  # SQLite before 3.32 takes at most 999 parameters
        for job_id in TrainingJob.objects.filter(id__in=ids[start : start + 900]).values_list("id", flat=True)
    }
    removed = False
    for job, folders in found.items():
        if job in known:
            continue
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)  # fd-based: a link planted inside is not followed
            log.warning("removed %s: no job of this console has it", folder)
            removed = True
    return removed


def _release_on_host(job: TrainingJob, host: DockerHost) -> bool:
    label = f"console.job={job.id}"
    try:
        for container in standby.standbys_on(host, job.id):  # what finish() queued may have missed
            standby.remove_quietly(container, "its job ended (resources released)")
        if engine.containers_labelled(host, label):
            return False  # still being drained or removed; volumes in use cannot go
        engine_networks.remove_labelled_volumes_and_networks(host, label)  # and the job's own networks
    except engine.EngineError as exc:
        log.info("resources of %s on %s stay for now: %s", job.id, host.name, exc)
        return False
    return True


def _code_copies(job: TrainingJob) -> Path:
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
    from . import later

    for job_id in ids:
        later.release_job_resources(job_id)
    return bool(ids)


# A container nobody removed is left alone this long after its instance ended: the follower
# that drains its log and removes it normally does so within seconds (settings.ORPHAN_GRACE_S).
# A container no task run knows (its job was deleted, or another console shares the engine
# and the labels) is left alone far longer: this console cannot tell what it is for.
UNKNOWN_GRACE_S = 600


def scan_for_orphans_when_due() -> bool:
    """Reconcile step: the orphan scan below, of each host whose last scan is ORPHAN_SCAN_EVERY_S
    old, by the one worker that claims it. Reconcile runs every few seconds in every worker; a
    scan lists every container of the host (400 with 200 instances and their standbys), which
    the engine encodes and the worker decodes holding the interpreter lock, and an orphan is
    rare (a follower died) and waits ORPHAN_GRACE_S anyway."""
    claimed = claim_orphan_scans()
    if not claimed:
        return False
    removed = remove_orphaned_containers(claimed)
    # The console's own disk with it: as often, by the worker that claimed a scan.
    cutoff = timezone.now() - timezone.timedelta(seconds=UNKNOWN_GRACE_S)
    return remove_files_of_unknown_jobs(cutoff) or removed


def claim_orphan_scans() -> list[DockerHost]:
    """The reachable hosts whose orphan scan is due, each claimed for this caller: exactly one
    of the workers that race here moves the time it read (healthchecks' conditional UPDATE)."""
    now = timezone.now()
    due = DockerHost.objects.filter(enabled=True, isolated=False).filter(
        Q(orphans_scanned_at__isnull=True)
        | Q(orphans_scanned_at__lte=now - timezone.timedelta(seconds=settings.ORPHAN_SCAN_EVERY_S))
    )
    return [
        host
        for host in due
        if DockerHost.objects.filter(id=host.id, orphans_scanned_at=host.orphans_scanned_at).update(
            orphans_scanned_at=now
        )
        == 1
    ]


def remove_orphaned_containers(hosts: list[DockerHost] | None = None) -> bool:
    """Containers of this console that no follower will remove any more — their instance ended
    (or its host was lost and came back), nothing follows it, its attempt is over and the job
    does not keep it (retention) — and containers no task run knows, on `hosts` (default: every
    reachable host). One listing and one query per host (not a query per container: with 200
    instances running, a query each made reconcile a fifth of the worker's CPU); returns whether
    any was removed."""
    cutoff = timezone.now() - timezone.timedelta(seconds=settings.ORPHAN_GRACE_S)
    unknown_cutoff = timezone.now() - timezone.timedelta(seconds=UNKNOWN_GRACE_S)
    labels = [f"{settings.CONTAINER_LABEL}=1", *(f"{k}={v}" for k, v in settings.CONTAINER_EXTRA_LABELS.items())]
    removed = False
    if hosts is None:
        hosts = list(DockerHost.objects.filter(enabled=True, isolated=False))
    for host in hosts:
        try:
            containers = engine.containers_labelled(host, labels)
        except engine.EngineError as exc:
            log.info("cannot list the containers of %s: %s", host.name, exc)
            continue
        old_enough = {}
        standbys = {}
        for container in containers:
            name = standby.name_of(container)
            if standby.is_standby(container):
                standbys[name] = container
                continue
            created = datetime.fromtimestamp(container.attrs.get("Created", 0), tz=UTC)
            if created <= cutoff:
                old_enough[name] = (container, created < unknown_cutoff)
        runs = _runs_by_container_name(old_enough)
        for name, (container, old_enough_if_unknown) in old_enough.items():
            if not _orphaned(runs.get(name, []), cutoff, old_enough_if_unknown):
                continue
            try:
                engine.remove_container(container)
                removed = True
                log.warning("removed orphaned container %s on %s", name, host.name)
            except engine.EngineError as exc:
                log.info("could not remove orphaned container %s: %s", name, exc)
        for name, why in _unusable_standbys(host, standbys, unknown_cutoff):
            standby.remove_quietly(standbys[name], f"orphan scan on {host.name}: {why}")
            removed = True
        removed |= _remove_left_networks_and_volumes(host, labels, unknown_cutoff)
    return removed


def _remove_left_networks_and_volumes(host: DockerHost, labels: list[str], unknown_cutoff) -> bool:
    """What the follower's clear-up or a job's release left on the engine:
    - a network made for an attempt before its job's latest (docker_hosts.remove_past_networks):
      the removal failed, a create failed after its network was made, or the containers were
      removed elsewhere (a Stop while the attempt started, this scan). The latest attempt's own
      network is left (a start may be joining it); an ended job's go with the rest of its
      resources (release_job_resources).
    - the networks and volumes of a job this console does not know, made UNKNOWN_GRACE_S ago, as
      its containers: a job deleted before its release ran (within seconds of its end, or while
      a host was away). No row is left to release them by, and a network left for good takes
      one of the engine's address pools (about thirty).
    The engine refuses to remove one a container uses."""
    listed: dict[str, list[engine_networks.Labelled]] = {}
    for what, listing in (
        ("network", lambda: engine_networks.networks_labelled(host, [*labels, "console.volume=network"])),
        ("volume", lambda: engine_networks.volumes_labelled(host, labels)),
    ):
        try:
            listed[what] = listing()
        except engine.EngineError as exc:
            log.info("cannot list the %ss of %s: %s", what, host.name, exc)
    items = [item for found in listed.values() for item in found]
    job_ids = sorted({job for item in items if (job := _job_of(item.labels))})
    latest = {
        str(job_id): number
        for start in range(0, len(job_ids), 900)  # SQLite before 3.32 takes at most 999 parameters
        for job_id, number in TrainingJob.objects.filter(id__in=job_ids[start : start + 900])
        .annotate(latest=Max("attempts__number"))
        .values_list("id", "latest")
    }
    removed = False
    for what, found in listed.items():
        remove = {
            "network": engine_networks.remove_network_unless_used,
            "volume": engine_networks.remove_volume_unless_used,
        }[what]
        for item in found:
            job = _job_of(item.labels)
            if job is None:
                continue  # not labelled as the console labels what it makes: not this scan's
            if job not in latest:
                if item.created is None or item.created >= unknown_cutoff:
                    continue
                why = "of a job this console does not know"
            elif what == "network" and docker_hosts.made_for_a_past_attempt(item.labels, latest[job]):
                why = "of a past attempt"
            else:
                continue
            try:
                if remove(host, item.name):
                    log.warning("removed the %s %s %s on %s", what, item.name, why, host.name)
                    removed = True
            except engine.EngineError as exc:
                log.info("could not remove the %s %s: %s", what, item.name, exc)
    return removed


def _job_of(labels: dict[str, str]) -> str | None:
    """The job id a console label names, as str(UUID) writes it; None for anything else."""
    try:
        return str(UUID(str(labels.get("console.job"))))
    except ValueError:
        return None


def _unusable_standbys(host: DockerHost, standbys: dict, unknown_cutoff) -> list[tuple[str, str]]:
    """Standbys (standby.py) no restart will take: their job ended, or the attempt they were made
    for started elsewhere or never came. One taken over since the listing (its task run is on this
    host now) is kept; so is one for the attempt after the job's latest. One of a job this console
    does not know is left UNKNOWN_GRACE_S, as any container it cannot tell the purpose of."""
    if not standbys:
        return []
    names = list(standbys)
    # The jobs before their runs: an attempt and its task runs are committed together, so a
    # restart that created the standby's attempt after the first query shows its run in the
    # second. The other way round, a scan read "no run" just before the restart's commit and
    # "latest" just after it, and removed the standby the restart was starting (a full run).
    job_ids = {standby.labels_of(c).get("console.job") for c in standbys.values()}
    jobs = {
        str(row["id"]): row
        for row in TrainingJob.objects.filter(id__in=[j for j in job_ids if _is_uuid(j)])
        .annotate(latest=Max("attempts__number"))
        .values("id", "phase", "terminate_requested", "latest")
    }
    runs = [
        run
        for start in range(0, len(names), 900)  # SQLite before 3.32 takes at most 999 parameters
        for run in TaskRun.objects.filter(container_name__in=names[start : start + 900]).values_list(
            "container_name", "host_id"
        )
    ]
    here = {name for name, host_id in runs if host_id == host.id}
    elsewhere = {name for name, host_id in runs if host_id != host.id}
    unusable = []
    for name, container in standbys.items():
        if name in here:
            continue
        labels = standby.labels_of(container)
        job = jobs.get(labels.get("console.job", ""))
        if job is None:
            created = datetime.fromtimestamp(container.attrs.get("Created", 0), tz=UTC)
            if created < unknown_cutoff:
                unusable.append((name, "no job of this console has it"))
        elif name in elsewhere:
            unusable.append((name, "its attempt runs on another host"))
        elif job["terminate_requested"] or job["phase"] in standby.ENDED_PHASES:
            unusable.append((name, f"its job is {job['phase']}"))
        elif str((job["latest"] or 0) + 1) != labels.get("console.attempt"):
            unusable.append((name, f"made for attempt {labels.get('console.attempt')}, the latest is {job['latest']}"))
    return unusable


def _is_uuid(value) -> bool:
    try:
        UUID(str(value))
    except ValueError:
        return False
    return True


def _runs_by_container_name(names) -> dict[str, list[dict]]:
    """What _orphaned needs of every task run of these containers, in one query per 900 names
    (SQLite before 3.32 takes at most 999 parameters)."""
    fields = (
        "container_name",
        "state",
        "follower_token",
        "ended_at",
        "attempt__state",
        "attempt__ended_at",
        "attempt__job__phase",
    )
    runs: dict[str, list[dict]] = {}
    names = list(names)
    for start in range(0, len(names), 900):
        for run in TaskRun.objects.filter(container_name__in=names[start : start + 900]).values(*fields):
            runs.setdefault(run["container_name"], []).append(run)
    return runs


def _orphaned(runs: list[dict], cutoff, old_enough_if_unknown: bool) -> bool:
    if not runs:
        return old_enough_if_unknown  # no task run knows it: nothing here will ever remove it
    for run in runs:
        # A run still "created" under an ended attempt never ran and never will: its start died
        # after it made (or even started) the container, and a Stop ended the attempt meanwhile;
        # no start runs an ended attempt. Its container is an orphan once the attempt ended a while ago.
        never_ran = run["state"] == TaskRun.State.CREATED and run["attempt__state"] == Attempt.State.ENDED
        if (run["state"] in (TaskRun.State.CREATED, TaskRun.State.RUNNING) and not never_ran) or run["follower_token"]:
            return False
        if run["attempt__state"] != Attempt.State.ENDED or run["attempt__job__phase"] in RETAINED_PHASES:
            return False
        ended_at = run["attempt__ended_at"] if never_ran else run["ended_at"]
        if ended_at is None or ended_at > cutoff:
            return False
    return True
