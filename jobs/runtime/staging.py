"""The host side of a job's layout (layout.py): what its containers' mounts need on the host
when a container is created (the copy of the code, the code backup, missing directories,
the summary folder, the SSH files of jobs/runtime/ssh.py), and the Docker mounts made from
the same entries.

Host paths (job data, the local code copies, the SSH dirs, the object storage root,
host-directory file systems) must be the same on the console and on every Docker host: shared
storage mounted at the same place, as for the job data dir (docs/decisions.md).

Jobs write in most of these folders, and the console works in them as root: every host path is
a trusted root and a relative part walked without following links (jobs/runtime/hostpaths.py).
A link a job planted on the way (`ln -s / <file system>/root`, `ln -s /etc <backup dir>/<job>-worker-0`)
fails the start with a StagingError naming it; bind mount sources are checked the same way.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from jobs import storage
from jobs import validators as v
from jobs.models import FileSystem

from . import engine, hostpaths, ssh
from .engine import Mount
from .layout import (
    BACKUP_CODE_FOLDER,
    LOCAL_CODE_STAGING,
    MA_GID,
    MA_UID,
    MA_USER,
    MUTUAL_TRUST,
    Kind,
    LayoutEntry,
    instance_hostname,
    local_code_dir,
    runtime_layout,
    summary_folder,
)

if TYPE_CHECKING:
    from jobs.models import Attempt, TaskRun, TrainingJob


class StagingError(engine.EngineError):
    """A directory of the job could not be prepared (a missing dataset or code dir, a file
    system gone from the catalogue). A refusal, not an unreachable host: the start fails as
    "could not start" (START_FAILED, a user error) with this message, not as a lost host."""

    def __init__(self, message: str):
        super().__init__(message, explanation=message)


# -- host side -------------------------------------------------------------------------------------------
def job_data_path(job: TrainingJob) -> Path:
    return Path(settings.JOB_DATA_ROOT) / str(job.id)


def job_data_dir(job: TrainingJob) -> Path:
    """The job-scoped persistent directory (SPEC §8) on the hosts' shared storage, created on first use."""
    _job_data_root_made()
    hostpaths.makedirs_confined(settings.JOB_DATA_ROOT, str(job.id), owner=MA_USER)
    return job_data_path(job)


def _job_data_root_made() -> Path:
    """JOB_DATA_ROOT, made if missing: the operator's setting, trusted (jobs only see folders below it)."""
    root = Path(settings.JOB_DATA_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    return root


def _local_code_relative(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> str:
    return f"{LOCAL_CODE_STAGING}/{job.id}/a{attempt.number}-w{task_run.index}"


def local_code_path(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> Path:
    """The host directory bound at MA_JOB_DIR in this instance's container of this attempt."""
    return Path(settings.JOB_DATA_ROOT) / _local_code_relative(job, attempt, task_run)


def cache_volume(job: TrainingJob, task_run: TaskRun) -> str:
    return f"console-cache-{job.id.hex[:12]}-{task_run.index}"


def nfs_volume(job: TrainingJob, mount_number: int) -> str:
    return f"console-nfs-{job.id.hex[:12]}-{mount_number}"


def volume_labels(job: TrainingJob, what: str) -> dict[str, str]:
    """Labels of the volumes Docker creates for a job's mounts: jobs/runtime/cleanup.py finds
    (and removes) a job's volumes on each host by them once the job has ended."""
    return {settings.CONTAINER_LABEL: "1", "console.job": str(job.id), "console.volume": what} | dict(
        settings.CONTAINER_EXTRA_LABELS
    )


def give_to_ma_user(path: Path) -> None:
    """Make `path` writable by uid 1000 inside the container (no-new-privileges: it cannot chown).
    For a path the console made itself; a folder a job writes in is given through its descriptor
    (hostpaths.give)."""
    try:
        os.lchown(path, MA_UID, MA_GID)
    except PermissionError:
        # A console not running as root cannot chown: open its own directory to everyone instead.
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o777 if path.is_dir() else 0o666))


# -- confined host paths: every message names the path the way the user knows it -------------------------
def _check_tenancy(job: TrainingJob, url: str, what: str) -> None:
    """Every object storage path a job uses is in a bucket owned by or granted to its workspace,
    asked again at use time: a grant revoked (or a bucket handed to another workspace) after
    submission refuses the start instead of letting the job reach another workspace's data."""
    if message := storage.tenancy_error(url, job.workspace_id, what):
        raise StagingError(f"{message} Refused: ask an operator to grant the bucket to this workspace.")


def _storage_source(job: TrainingJob, url: str, what: str) -> Path:
    """A bind mount source in object storage: a bucket of the job's workspace, no link below the bucket folder."""
    _check_tenancy(job, url, what)
    try:
        return storage.confined_path(url)
    except storage.StorageError as exc:
        raise StagingError(f"{what}: {exc}") from None


@contextmanager
def _storage_folder(job: TrainingJob, url: str, what: str, *, create: bool = False, owner=None) -> Iterator[int]:
    """A descriptor of the object storage folder `url` (storage.open_folder) in a bucket of the job's
    workspace; a StagingError names what is wrong."""
    _check_tenancy(job, url, what)
    stack = ExitStack()
    try:
        fd = stack.enter_context(storage.open_folder(url, create=create, owner=owner))
    except storage.StorageError as exc:
        raise StagingError(f"{what}: {exc}") from None
    with stack:
        yield fd


def _host_dir_relative(path: str) -> str:
    # A path validation would refuse ('..') is walked as it is, and so refused, never made '/'.
    return v.normalized_path(path) or path or "/"


def _file_system_refusal(fs: FileSystem, what: str, exc: hostpaths.PathEscape) -> StagingError:
    return StagingError(
        f"{what}: '{fs.name}:/{exc.at}' {exc.reason}: the console never follows a link in a file system "
        "for a job (a job may have planted it); remove it or choose another path."
    )


def _check_file_system_grant(job: TrainingJob, fs: FileSystem, what: str) -> None:
    """Asked again at use time, as for buckets: a grant an operator revoked after submission
    refuses the start instead of mounting another workspace's file system."""
    if message := fs.refusal(job.workspace_id, what):
        raise StagingError(f"{message} Refused: ask an operator to grant it to this workspace.")


def _file_system_source(fs: FileSystem, path: str, what: str) -> Path:
    """A bind mount source in a host-directory file system: no link below its root."""
    try:
        return hostpaths.confined(fs.source, _host_dir_relative(path))
    except hostpaths.PathEscape as exc:
        raise _file_system_refusal(fs, what, exc) from None


def _make_file_system_dir(fs: FileSystem, path: str, what: str) -> None:
    """The folder `path` of a host-directory file system, made where missing. A folder made here is
    the job's (given to ma-user); an existing one keeps its owner: it is the operator's data."""
    Path(fs.source).mkdir(parents=True, exist_ok=True)  # the root: the operator's setting
    try:
        hostpaths.makedirs_confined(fs.source, _host_dir_relative(path), owner=MA_USER)
    except hostpaths.PathEscape as exc:
        raise _file_system_refusal(fs, what, exc) from None


def _job_data_source(relative: str, what: str) -> Path:
    """A bind mount source below JOB_DATA_ROOT (job data, code copies, SSH files): no link on the way."""
    try:
        return hostpaths.confined(settings.JOB_DATA_ROOT, relative)
    except hostpaths.PathEscape as exc:
        raise StagingError(f"{what}: '{exc.at}' below the job data root {exc.reason}; refused.") from None


def stage_local_code(job: TrainingJob, attempt: Attempt, task_run: TaskRun, *, remove_older: bool = True) -> Path:
    """This container's local code dir: a fresh copy of the code dir's folder, owned by ma-user.

    A copy, not the object storage folder itself: instances write into their code dir
    (caches, outputs) without touching the user's code or each other, as each instance
    downloads the code in ModelArts. One copy per attempt and instance, made once (a
    start retried for the same attempt reuses it); a process-level restart keeps the
    container and so its copy, a container-level restart gets a new one. A standby container
    (standby.py) is staged while an earlier copy is still bound in the running container:
    it keeps the older copies (`remove_older=False`) until it is taken over.

    The code dir is read without following any link on the way (a link planted in the bucket is
    refused) and copied with hostpaths.copytree_into: links are copied as links, never followed.
    """
    root = _job_data_root_made()
    name = f"a{attempt.number}-w{task_run.index}"
    try:
        with hostpaths.open_dir(root, f"{LOCAL_CODE_STAGING}/{job.id}", create=True) as parent:
            if not hostpaths.is_dir_at(parent, name):
                _copy_code(job, parent, name)
            if remove_older:
                _remove_older_copies(parent, attempt, task_run)
    except hostpaths.PathEscape as exc:
        raise StagingError(f"Local code dir: '{exc.at}' {exc.reason}; refused.") from None
    return local_code_path(job, attempt, task_run)


def _remove_older_copies(parent: int, attempt: Attempt, task_run: TaskRun) -> None:
    for old in os.listdir(parent):  # earlier attempts' copies: their containers are gone
        number, _, index = old[1:].partition("-w")
        if old.startswith("a") and number.isdigit() and index == str(task_run.index):
            if int(number) < attempt.number:
                _remove_quietly(parent, old)


def remove_older_code_copies(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> None:
    """Earlier attempts' copies of this instance, left by a standby's staging, once it is taken over."""
    try:
        with hostpaths.open_dir(_job_data_root_made(), f"{LOCAL_CODE_STAGING}/{job.id}") as parent:
            _remove_older_copies(parent, attempt, task_run)
    except (hostpaths.PathEscape, OSError):
        pass  # nothing staged, or a link where the console's folder was: nothing of ours to remove


def code_budget() -> hostpaths.CopyBudget:
    """The code dir's limits (SPEC §3), enforced again while copying: its bucket may be
    mounted read-write into a running job, which could grow it after submission."""
    return hostpaths.CopyBudget(v.CODE_DIR_MAX_FILES, v.CODE_DIR_MAX_BYTES, "the code dir")


def _copy_code(job: TrainingJob, parent: int, name: str) -> None:
    with ExitStack() as stack:
        source = stack.enter_context(_storage_folder(job, job.code_dir, "Code dir")) if job.code_dir else None
        # Copied aside and renamed into place: a start that dies half-way leaves no partial copy in use.
        tmp = hostpaths.make_temp_dir(parent, f".{name}.", 0o755)
        try:
            folder = hostpaths.open_child(parent, tmp)
            try:
                if source is not None:
                    os.mkdir(job.code_folder, 0o700, dir_fd=folder)
                    code = hostpaths.open_child(folder, job.code_folder)
                    try:
                        hostpaths.copytree_into(source, code, owner=MA_USER, budget=code_budget())
                        os.fchmod(code, os.fstat(source).st_mode & 0o777)
                        hostpaths.give(code, MA_USER)
                    finally:
                        os.close(code)
                hostpaths.give(folder, MA_USER)
            finally:
                os.close(folder)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except OSError:
            _remove_quietly(parent, tmp)
            if not hostpaths.is_dir_at(parent, name):  # not a concurrent start of the same attempt that won the rename
                raise


def _remove_quietly(dir_fd: int, name: str) -> None:
    with suppress(OSError):
        hostpaths.remove_at(dir_fd, name)


def backup_code(job: TrainingJob, task_run: TaskRun, local_code: Path) -> Path | None:
    """SPEC §3 code backup: the local code folder to <dir>/<job>-<task>-<index>/user-job-dir/<folder>.

    The backup dir is in a bucket jobs may write (mounted read-write, or a job's artifacts): the
    folders on the way are opened without following links, so `ln -s /etc <dir>/<job>-worker-0`
    fails the start with a message naming the link instead of leading the copy into /etc. The
    source, the job's own local code dir (written by its containers), is read the same way.
    """
    if not (job.code_backup_dir and job.code_dir):
        return None
    _check_tenancy(job, job.code_backup_dir, "Code backup dir")
    if not storage.bucket_exists(job.code_backup_dir):
        # Never create a bucket as a side effect: that is the user's (or operator's) doing.
        raise StagingError(f"Code backup dir: the bucket of '{job.code_backup_dir}' does not exist.")
    folder = job.code_folder
    parent_url = f"{job.code_backup_dir.rstrip('/')}/{job.name}-{task_run.task_name}/{BACKUP_CODE_FOLDER}/"
    with ExitStack() as stack:
        try:
            source_relative = Path(local_code).relative_to(settings.JOB_DATA_ROOT) / folder
            source = stack.enter_context(hostpaths.open_dir(settings.JOB_DATA_ROOT, source_relative))
        except hostpaths.PathEscape:
            raise StagingError(
                f"Code backup: {local_code_dir(job)}/{folder} of this instance is a symbolic link; "
                "the console never follows a link a job may have planted: refused."
            ) from None
        parent = stack.enter_context(_storage_folder(job, parent_url, "Code backup dir", create=True))
        tmp = hostpaths.make_temp_dir(parent, f".{folder}.")
        try:
            copy = hostpaths.open_child(parent, tmp)
            try:
                owner = storage.console_owner()
                hostpaths.copytree_into(source, copy, owner=owner, budget=code_budget())
                os.fchmod(copy, os.fstat(source).st_mode & 0o777)
                if owner is not None:
                    hostpaths.give(copy, owner)
            finally:
                os.close(copy)
            # The latest start's code replaces the previous backup (whatever is there: a link is
            # replaced, never followed).
            hostpaths.replace_dir(parent, tmp, folder)
        except hostpaths.PathEscape as exc:
            _remove_quietly(parent, tmp)
            raise StagingError(f"Code backup: {local_code_dir(job)}/{folder}/{exc.at} {exc.reason}: refused.") from None
        except BaseException:
            _remove_quietly(parent, tmp)
            raise
    return _storage_source(job, parent_url, "Code backup dir") / folder


def _refuse_shared_paths(layout: list[LayoutEntry]) -> None:
    # Validation keeps user mount paths unique; the local code dir is not among them.
    seen: dict[str, str] = {}
    for entry in layout:
        if entry.mounted and entry.container_path in seen:
            raise StagingError(
                f"{entry.what} and {seen[entry.container_path]} are both mounted at {entry.container_path}: "
                "mount paths must differ."
            )
        seen[entry.container_path] = entry.what


def prepare_sources(
    job: TrainingJob,
    attempt: Attempt,
    task_run: TaskRun,
    layout: list[LayoutEntry] | None = None,
    *,
    standby: bool = False,
) -> list[LayoutEntry]:
    """Make on the host what the mounts of this container need; returns the layout used.

    Raises StagingError with a message for the user when something the job names is not
    there (its code dir, a dataset, the object storage mount, a file system).
    """
    layout = runtime_layout(job) if layout is None else layout
    _refuse_shared_paths(layout)
    try:
        for entry in layout:
            _prepare(job, attempt, task_run, entry, standby)
    except OSError as exc:
        raise StagingError(f"Preparing the job's directories failed: {exc}") from None
    return layout


def recheck_sources(job: TrainingJob, attempt: Attempt, task_run: TaskRun, layout: list[LayoutEntry]) -> list[Mount]:
    """The mounts this container would get now, every source confined and every grant asked again,
    right before a standby (standby.py) starts; of its staging only the SSH files are made again
    (authorized_keys follows the user's key pair as it is now). Raises StagingError."""
    _refuse_shared_paths(layout)
    for entry in layout:
        if entry.kind == Kind.FILE_SYSTEM and entry.ref[0] is not None:
            _check_file_system_grant(job, entry.ref[0], entry.what)
        elif entry.kind == Kind.SUMMARY and entry.ref is not None:
            _check_file_system_grant(job, entry.ref, entry.what)
        elif entry.kind == Kind.SSH:
            _prepare(job, attempt, task_run, entry, True)
    return mounts_for(job, attempt, task_run, layout)


def _prepare(job: TrainingJob, attempt: Attempt, task_run: TaskRun, entry: LayoutEntry, standby: bool) -> None:
    if entry.kind == Kind.JOB_DATA:
        job_data_dir(job)
    elif entry.kind == Kind.LOCAL_CODE:
        backup_code(job, task_run, stage_local_code(job, attempt, task_run, remove_older=not standby))
    elif entry.kind == Kind.DATASET:
        if entry.ref is None:
            raise StagingError(f"{entry.what} no longer exists.")
        with _storage_folder(job, entry.ref.path, entry.what):
            pass
    elif entry.kind == Kind.OBS:
        # Mounted as it is: its owner and modes say what the job (uid 1000) may write there; the
        # console never changes the owner of data it mounts (docs/decisions.md).
        with _storage_folder(job, entry.ref, entry.what):
            pass
    elif entry.kind == Kind.ARTIFACTS:
        if not entry.ref:
            raise StagingError("Artifacts: no storage path is set.")
        _storage_source(job, entry.ref, "Artifacts")  # a malformed path or another workspace's first
        if not storage.bucket_exists(entry.ref):
            raise StagingError(f"Artifacts: the bucket of '{entry.ref}' does not exist.")
        # The artifact folder is the job's output (and checkpoint) folder: one made here is given to
        # ma-user; an existing one keeps its owner (its modes say whether the job may write there).
        with _storage_folder(job, entry.ref, "Artifacts", create=True, owner=MA_USER):
            pass
    elif entry.kind == Kind.FILE_SYSTEM:
        fs, mount = entry.ref
        if fs is None:
            raise StagingError(f"File system '{mount.get('file_system')}' no longer exists.")
        _check_file_system_grant(job, fs, entry.what)
        if fs.kind == FileSystem.Kind.HOST_DIR:
            _make_file_system_dir(fs, mount.get("path") or "/", entry.what)
    elif entry.kind == Kind.SUMMARY:
        _prepare_summary(job, entry)
    elif entry.kind == Kind.SSH:
        what, key = entry.ref
        if what == MUTUAL_TRUST:
            hostnames = [instance_hostname(job, i) for i in range(job.node_count)]
            ssh.prepare_mutual_trust(job, entry.container_path, hostnames)
        else:
            ssh.prepare_remote_access(job, key.public_key if key else None)


def _prepare_summary(job: TrainingJob, entry: LayoutEntry) -> None:
    fs = entry.ref
    if fs is None:
        raise StagingError(f"{entry.what}: the file system no longer exists.")
    _check_file_system_grant(job, fs, entry.what)
    if fs.kind == FileSystem.Kind.HOST_DIR:
        # The summaries folder itself stays the operator's; the job's folder is the job's.
        _make_file_system_dir(fs, summary_folder(job), entry.what)
    # NFS: the console does not mount exports itself, so it cannot make the folder; the mount
    # of a folder missing on the server fails the start (docs/decisions.md).


# -- Docker mounts ---------------------------------------------------------------------------------------
def nfs_mount(
    target: str, fs: FileSystem, mount: dict, volume_name: str, labels: dict[str, str] | None = None
) -> Mount:
    """An NFS file system mount: a volume of Docker's local driver that mounts the export
    (type=nfs, o=addr=<server>,<options>, device=:<export>/<path>) when the container starts."""
    server, _, export = fs.source.partition(":")
    sub = (v.normalized_path(mount.get("path") or "/") or "/").lstrip("/")
    device = ":" + (posixpath.join(export, sub).rstrip("/") if sub else export)
    options = mount.get("options") or v.DEFAULT_NFS_OPTIONS
    if message := v.nfs_options_error(options):  # again at each start: a job saved before a rule came
        raise StagingError(f"File system mount {target}: {message}")
    return engine.volume_mount(
        target,
        volume_name,
        read_only=bool(mount.get("read_only")),
        labels=labels,
        nfs={"type": "nfs", "o": f"addr={server},{options}", "device": device},
    )


def mounts_for(
    job: TrainingJob, attempt: Attempt, task_run: TaskRun, layout: list[LayoutEntry] | None = None
) -> list[Mount]:
    """The Docker mounts of this container: one per mounted entry of the layout, nothing else."""
    layout = runtime_layout(job) if layout is None else layout
    mounts = []
    file_systems = 0
    for entry in (e for e in layout if e.mounted):
        target, ro = entry.container_path, entry.read_only
        if entry.kind == Kind.LOCAL_CODE:
            source = str(_job_data_source(_local_code_relative(job, attempt, task_run), entry.what))
        elif entry.kind == Kind.JOB_DATA:
            source = str(_job_data_source(str(job.id), entry.what))
        elif entry.kind == Kind.CACHE:
            # A per-instance scratch volume, created on the instance's host.
            # An image's files at /cache are not copied in (engine.volume_mount never does): an
            # image with millions of them would make the create time out (and look like a lost host).
            mounts.append(engine.volume_mount(target, cache_volume(job, task_run), labels=volume_labels(job, "cache")))
            continue
        elif entry.kind == Kind.DATASET:
            if entry.ref is None:
                raise StagingError(f"{entry.what} no longer exists.")
            source = str(_storage_source(job, entry.ref.path, entry.what))
        elif entry.kind in (Kind.OBS, Kind.ARTIFACTS):
            source = str(_storage_source(job, entry.ref or "", entry.what))
        elif entry.kind == Kind.FILE_SYSTEM:
            fs, mount = entry.ref
            if fs is None:
                raise StagingError(f"File system '{mount.get('file_system')}' no longer exists.")
            file_systems += 1
            if fs.kind == FileSystem.Kind.NFS:
                mounts.append(nfs_mount(target, fs, mount, nfs_volume(job, file_systems), volume_labels(job, "nfs")))
                continue
            source = str(_file_system_source(fs, mount.get("path") or "/", entry.what))
        elif entry.kind == Kind.SUMMARY:
            fs = entry.ref
            if fs is None:
                raise StagingError(f"{entry.what}: the file system no longer exists.")
            if fs.kind == FileSystem.Kind.NFS:
                summary = {"path": summary_folder(job), "read_only": False}
                volume = f"console-nfs-{job.id.hex[:12]}-summary"
                mounts.append(nfs_mount(target, fs, summary, volume, volume_labels(job, "nfs")))
                continue
            source = str(_file_system_source(fs, summary_folder(job), entry.what))
        elif entry.kind == Kind.SSH:
            source = str(_job_data_source(f"{ssh.SSH_STAGING}/{job.id}", entry.what))
        else:  # pragma: no cover - a kind added to runtime_layout() and not here
            raise ValueError(f"no mount for {entry.kind!r}")
        mounts.append(engine.bind_mount(target, source, read_only=ro))
    return mounts
