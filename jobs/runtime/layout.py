"""What a job's containers see where (SPEC §3 "runtime environment preview", SPEC §8).

One description, two uses, so that the preview and the containers never differ:

- `runtime_layout(job)` lists every directory of the job's containers: the local code
  dir (MA_JOB_DIR) and the code folder in it, datasets, the object storage mount, file
  system mounts, the TensorBoard / MindStudio Insight summary dir (MA_SUMMARY_DIR),
  artifacts, the SSH dir (mutual-trust files or SSH remote development), the job data
  dir and /cache. It works for an unsaved job (the create wizard shows it before
  submitting); it only reads the catalogue (datasets, file systems, key pairs).
- `prepare_sources(...)` makes what those mounts need on the host when a container is
  created (the copy of the code, the code backup, missing directories, the summary
  folder, the SSH files of jobs/runtime/ssh.py) and `mounts_for(...)` turns the same
  entries into Docker mounts.

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
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
from django.conf import settings

from jobs import storage
from jobs import validators as v
from jobs.models import DATA_MOUNT_ROOT, Dataset, FileSystem, KeyPair

from . import hostpaths, ssh

if TYPE_CHECKING:
    from jobs.models import Attempt, TaskRun, TrainingJob

MA_UID = MA_GID = 1000  # ma-user (SPEC §8)
MA_USER = (MA_UID, MA_GID)
JOB_DATA_MOUNT = "/job-data"
CACHE_MOUNT = "/cache"
# Where the per-instance copies of the code live: <JOB_DATA_ROOT>/.local-code/<job id>/a<attempt>-w<index>.
# Beside the job data dirs (same shared storage), not inside one: /job-data stays the user's own.
LOCAL_CODE_STAGING = ".local-code"
BACKUP_CODE_FOLDER = "user-job-dir"  # SPEC §3: <backup dir>/<job>-<task>-<index>/user-job-dir/<folder>
# TensorBoard / MindStudio Insight: each job writes into <file system>/summaries/<job name>-<job id>/.
SUMMARIES_FOLDER = "summaries"
# What an SSH entry's ref holds first: (MUTUAL_TRUST, None) or (REMOTE, the key pair or None).
MUTUAL_TRUST, REMOTE = "mutual_trust", "remote"


class Kind:
    """What an entry is; mounts_for() and prepare_sources() dispatch on it."""

    LOCAL_CODE = "local_code"
    CODE = "code"
    DATASET = "dataset"
    OBS = "obs"
    FILE_SYSTEM = "file_system"
    ARTIFACTS = "artifacts"
    SUMMARY = "summary"
    SSH = "ssh"
    JOB_DATA = "job_data"
    CACHE = "cache"


@dataclass(frozen=True)
class LayoutEntry:
    """One directory of the job's containers.

    `source` and `what` are for people (the preview); `kind` and `ref` (the dataset, the
    obs:// URL, the file system and its mount settings) are what the runtime needs.
    `mounted` is False for a folder that lies inside another entry's mount (the code
    folder inside the local code dir): it is shown, but is not a mount of its own.
    """

    container_path: str
    source: str
    mode: str  # "rw" or "ro"
    what: str
    kind: str = ""
    mounted: bool = True
    ref: Any = field(default=None, compare=False, repr=False)

    @property
    def read_only(self) -> bool:
        return self.mode == "ro"


class StagingError(docker.errors.APIError):
    """A directory of the job could not be prepared (a missing dataset or code dir, a file
    system gone from the catalogue). An APIError, so that the start fails as "could not
    start" (START_FAILED, a user error) with this message, not as a lost host."""

    def __init__(self, message: str):
        super().__init__(message, explanation=message)


# -- the layout ------------------------------------------------------------------------------------------
def local_code_dir(job: TrainingJob) -> str:
    return job.local_code_dir or v.DEFAULT_LOCAL_CODE_DIR


def instance_hostname(job: TrainingJob, index: int) -> str:
    """The name instance `index` of the job has for the others (MA_VOLCANO_HOSTS, the ssh config)."""
    return f"{job.name.lower().replace('_', '-')}-worker-{index}"


def _container_path(value) -> str:
    return (v.normalized_path(value) or value) if isinstance(value, str) else ""


def _dataset_ids(job: TrainingJob) -> list[int]:
    # The wizard previews before validation: ids may still be strings of digits.
    ids = []
    for i in job.datasets if isinstance(job.datasets, list) else []:
        if isinstance(i, str) and i.isdigit():
            i = int(i)
        if isinstance(i, int) and not isinstance(i, bool):
            ids.append(i)
    return ids


def dataset_folder(name: str, used: set[str]) -> str:
    """A dataset's folder under DATA_MOUNT_ROOT: its name with anything but letters, digits,
    '.', '_' and '-' replaced by '_'; a name taken already (a preset and a user's dataset may
    share one) gets -2, -3, ..."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "dataset"
    folder, n = base, 1
    while folder in used:
        n += 1
        folder = f"{base}-{n}"
    used.add(folder)
    return folder


def runtime_layout(job: TrainingJob) -> list[LayoutEntry]:
    """Every directory the job's containers will see, in the order the preview shows them.

    Works for an unsaved (even not yet validated) job: what cannot be resolved (a dataset
    or file system that does not exist) is listed with "(missing)" and refused at start.
    """
    local = local_code_dir(job)
    entries = [
        LayoutEntry(local, "local directory of each instance", "rw", "Local code dir (MA_JOB_DIR)", Kind.LOCAL_CODE)
    ]
    if job.code_dir:
        entries.append(
            LayoutEntry(
                posixpath.join(local, job.code_folder),
                job.code_dir,
                "rw",
                "Code folder (copied at each container start)",
                Kind.CODE,
                mounted=False,
                ref=job.code_dir,
            )
        )
    ids = _dataset_ids(job)
    found = Dataset.objects.in_bulk(ids) if ids else {}
    used: set[str] = set()
    for i in ids:
        dataset = found.get(i)
        name = dataset.name if dataset else f"dataset-{i}"
        path = f"{DATA_MOUNT_ROOT}/{dataset_folder(name, used)}"
        if dataset is None:
            entries.append(LayoutEntry(path, f"dataset {i} (missing)", "ro", f"Dataset {i}", Kind.DATASET))
        else:
            entries.append(LayoutEntry(path, dataset.path, "ro", f"Dataset {dataset.name}", Kind.DATASET, ref=dataset))
    if job.dedicated:  # SPEC §3: mounts are dedicated-pool settings; on the public pool they are ignored
        for mount in job.obs_mounts if isinstance(job.obs_mounts, list) else []:
            if isinstance(mount, dict) and mount.get("mount_path"):
                url = mount.get("obs_url") or ""
                entries.append(
                    LayoutEntry(
                        _container_path(mount["mount_path"]), url, "rw", "Object storage mount", Kind.OBS, ref=url
                    )
                )
        entries.extend(_file_system_entries(job))
        entries.extend(_summary_entries(job))
    if job.store_artifacts and job.artifact_mount_path:
        entries.append(
            LayoutEntry(
                _container_path(job.artifact_mount_path),
                job.artifact_path or "(no storage path)",
                "rw",
                "Artifacts",
                Kind.ARTIFACTS,
                ref=job.artifact_path,
            )
        )
    entries.extend(_ssh_entries(job))
    entries.append(
        LayoutEntry(JOB_DATA_MOUNT, "job data (persistent)", "rw", "Job data (MA_CHECKPOINT_DIR)", Kind.JOB_DATA)
    )
    entries.append(LayoutEntry(CACHE_MOUNT, "scratch volume of each instance", "rw", "Cache", Kind.CACHE))
    return entries


def _file_system_entries(job: TrainingJob) -> list[LayoutEntry]:
    mounts = [m for m in job.file_system_mounts or [] if isinstance(m, dict) and m.get("mount_path")]
    names = [m.get("file_system") for m in mounts if isinstance(m.get("file_system"), str)]
    systems = FileSystem.objects.in_bulk(names, field_name="name") if names else {}
    entries = []
    for mount in mounts:
        fs = systems.get(mount.get("file_system"))
        path = mount.get("path") or "/"
        source = f"file system {mount.get('file_system')}:{path}" + ("" if fs else " (missing)")
        mode = "ro" if mount.get("read_only") else "rw"
        entries.append(
            LayoutEntry(
                _container_path(mount["mount_path"]),
                source,
                mode,
                "File system mount",
                Kind.FILE_SYSTEM,
                ref=(fs, mount),
            )
        )
    return entries


def summary_folder(job: TrainingJob) -> str:
    """The job's summary folder on its observe file system: its own, never shared with another job."""
    return f"/{SUMMARIES_FOLDER}/{job.name}-{job.id}"


def _summary_entries(job: TrainingJob) -> list[LayoutEntry]:
    """TensorBoard / MindStudio Insight (dedicated pools only): the summary dir, read-write.

    Only the folder is provided: no TensorBoard or MindStudio Insight server runs for the job
    (nothing could reach it: a job has no route out, SPEC §8); the summaries stay on the file
    system for a viewer run elsewhere.
    """
    if not (job.tensorboard or job.mindstudio_insight) or not job.observe_file_system_id or not job.observe_path:
        return []
    tool = "TensorBoard" if job.tensorboard else "MindStudio Insight"
    # Not job.observe_file_system: an unsaved job may name one that does not exist.
    fs = FileSystem.objects.filter(id=job.observe_file_system_id).first()
    folder = summary_folder(job) if job.name else f"/{SUMMARIES_FOLDER}/<job name>-{job.id}"
    name = fs.name if fs else f"{job.observe_file_system_id} (missing)"
    return [
        LayoutEntry(
            _container_path(job.observe_path),
            f"file system {name}:{folder}/ (no {tool} server is started: view the summaries elsewhere)",
            "rw",
            f"{tool} summaries (MA_SUMMARY_DIR)",
            Kind.SUMMARY,
            ref=fs,
        )
    ]


def _ssh_entries(job: TrainingJob) -> list[LayoutEntry]:
    """The SSH dir: mutual-trust files, or authorized_keys for SSH remote development.

    The two exclude each other (validation refuses both); a job saved around validation with
    both gets the mutual-trust files only: one directory, one authorized_keys. Read-only in
    the containers: the files are shared by every instance of the job.
    """
    if job.mutual_trust:
        path = _container_path(job.mutual_trust_dir or v.DEFAULT_MUTUAL_TRUST_DIR)
        source = "key pair generated for this job (id_ed25519, authorized_keys, config): the same in every instance"
        return [LayoutEntry(path, source, "ro", "Mutual-trust SSH files", Kind.SSH, ref=(MUTUAL_TRUST, None))]
    if job.ssh_remote:
        key = KeyPair.objects.filter(id=job.ssh_key_pair_id).first() if job.ssh_key_pair_id else None
        source = f"authorized_keys with your key pair {key.name if key else '(none)'}; sshd is the image's to run"
        if job.node_count == 1:
            source += " (one instance has no network: nothing can reach it)"
        return [LayoutEntry(ssh.REMOTE_SSH_DIR, source, "ro", "SSH remote development", Kind.SSH, ref=(REMOTE, key))]
    return []


def layout_environment(job: TrainingJob, layout: list[LayoutEntry]) -> dict[str, str]:
    """The env vars that tell the job where things are (SPEC §8)."""
    env = {"MA_JOB_DIR": local_code_dir(job)}
    datasets = []
    for entry in layout:
        if entry.kind == Kind.CODE:
            env["MA_CODE_DIR"] = entry.container_path
        elif entry.kind == Kind.DATASET:
            env[f"MA_DATASET_{len(datasets)}_DIR"] = entry.container_path
            datasets.append(entry.container_path)
        elif entry.kind == Kind.ARTIFACTS:
            env["MA_ARTIFACT_DIR"] = entry.container_path
        elif entry.kind == Kind.SUMMARY:
            env["MA_SUMMARY_DIR"] = entry.container_path
    if datasets:
        env["MA_DATASET_DIRS"] = ":".join(datasets)
    return env


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
def _storage_source(url: str, what: str) -> Path:
    """A bind mount source in object storage: no link below the bucket folder."""
    try:
        return storage.confined_path(url)
    except storage.StorageError as exc:
        raise StagingError(f"{what}: {exc}") from None


@contextmanager
def _storage_folder(url: str, what: str, *, create: bool = False, owner=None) -> Iterator[int]:
    """A descriptor of the object storage folder `url` (storage.open_folder); a StagingError names what is wrong."""
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


def stage_local_code(job: TrainingJob, attempt: Attempt, task_run: TaskRun) -> Path:
    """This container's local code dir: a fresh copy of the code dir's folder, owned by ma-user.

    A copy, not the object storage folder itself: instances write into their code dir
    (caches, outputs) without touching the user's code or each other, as each instance
    downloads the code in ModelArts. One copy per attempt and instance, made once (a
    start retried for the same attempt reuses it); a process-level restart keeps the
    container and so its copy, a container-level restart gets a new one.

    The code dir is read without following any link on the way (a link planted in the bucket is
    refused) and copied with hostpaths.copytree_into: links are copied as links, never followed.
    """
    root = _job_data_root_made()
    name = f"a{attempt.number}-w{task_run.index}"
    try:
        with hostpaths.open_dir(root, f"{LOCAL_CODE_STAGING}/{job.id}", create=True) as parent:
            if not hostpaths.is_dir_at(parent, name):
                _copy_code(job, parent, name)
            # Earlier attempts' copies of this instance belong to containers that are gone.
            for old in os.listdir(parent):
                number, _, index = old[1:].partition("-w")
                if old.startswith("a") and number.isdigit() and index == str(task_run.index):
                    if int(number) < attempt.number:
                        _remove_quietly(parent, old)
    except hostpaths.PathEscape as exc:
        raise StagingError(f"Local code dir: '{exc.at}' {exc.reason}; refused.") from None
    return local_code_path(job, attempt, task_run)


def code_budget() -> hostpaths.CopyBudget:
    """The code dir's limits (SPEC §3), enforced again while copying: its bucket may be
    mounted read-write into a running job, which could grow it after submission."""
    return hostpaths.CopyBudget(v.CODE_DIR_MAX_FILES, v.CODE_DIR_MAX_BYTES, "the code dir")


def _copy_code(job: TrainingJob, parent: int, name: str) -> None:
    with ExitStack() as stack:
        source = stack.enter_context(_storage_folder(job.code_dir, "Code dir")) if job.code_dir else None
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
    try:
        hostpaths.remove_at(dir_fd, name)
    except OSError:
        pass


def backup_code(job: TrainingJob, task_run: TaskRun, local_code: Path) -> Path | None:
    """SPEC §3 code backup: the local code folder to <dir>/<job>-<task>-<index>/user-job-dir/<folder>.

    The backup dir is in a bucket jobs may write (mounted read-write, or a job's artifacts): the
    folders on the way are opened without following links, so `ln -s /etc <dir>/<job>-worker-0`
    fails the start with a message naming the link instead of leading the copy into /etc. The
    source, the job's own local code dir (written by its containers), is read the same way.
    """
    if not (job.code_backup_dir and job.code_dir):
        return None
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
        parent = stack.enter_context(_storage_folder(parent_url, "Code backup dir", create=True))
        tmp = hostpaths.make_temp_dir(parent, f".{folder}.")
        try:
            copy = hostpaths.open_child(parent, tmp)
            try:
                hostpaths.copytree_into(source, copy, budget=code_budget())
                os.fchmod(copy, os.fstat(source).st_mode & 0o777)
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
    return _storage_source(parent_url, "Code backup dir") / folder


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
    job: TrainingJob, attempt: Attempt, task_run: TaskRun, layout: list[LayoutEntry] | None = None
) -> list[LayoutEntry]:
    """Make on the host what the mounts of this container need; returns the layout used.

    Raises StagingError with a message for the user when something the job names is not
    there (its code dir, a dataset, the object storage mount, a file system).
    """
    layout = runtime_layout(job) if layout is None else layout
    _refuse_shared_paths(layout)
    try:
        for entry in layout:
            _prepare(job, attempt, task_run, entry)
    except OSError as exc:
        raise StagingError(f"Preparing the job's directories failed: {exc}") from None
    return layout


def _prepare(job: TrainingJob, attempt: Attempt, task_run: TaskRun, entry: LayoutEntry) -> None:
    if entry.kind == Kind.JOB_DATA:
        job_data_dir(job)
    elif entry.kind == Kind.LOCAL_CODE:
        backup_code(job, task_run, stage_local_code(job, attempt, task_run))
    elif entry.kind == Kind.DATASET:
        if entry.ref is None:
            raise StagingError(f"{entry.what} no longer exists.")
        with _storage_folder(entry.ref.path, entry.what):
            pass
    elif entry.kind == Kind.OBS:
        with _storage_folder(entry.ref, entry.what) as folder:
            hostpaths.give(folder, MA_USER)
    elif entry.kind == Kind.ARTIFACTS:
        if not entry.ref:
            raise StagingError("Artifacts: no storage path is set.")
        _storage_source(entry.ref, "Artifacts")  # a malformed path first: its own message
        if not storage.bucket_exists(entry.ref):
            raise StagingError(f"Artifacts: the bucket of '{entry.ref}' does not exist.")
        # The artifact folder is the job's output (and checkpoint) folder: ma-user must write there.
        with _storage_folder(entry.ref, "Artifacts", create=True) as folder:
            hostpaths.give(folder, MA_USER)
    elif entry.kind == Kind.FILE_SYSTEM:
        fs, mount = entry.ref
        if fs is None:
            raise StagingError(f"File system '{mount.get('file_system')}' no longer exists.")
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
    if fs.kind == FileSystem.Kind.HOST_DIR:
        # The summaries folder itself stays the operator's; the job's folder is the job's.
        _make_file_system_dir(fs, summary_folder(job), entry.what)
    # NFS: the console does not mount exports itself, so it cannot make the folder; the mount
    # of a folder missing on the server fails the start (docs/decisions.md).


# -- Docker mounts ---------------------------------------------------------------------------------------
def nfs_mount(
    target: str, fs: FileSystem, mount: dict, volume_name: str, labels: dict[str, str] | None = None
) -> docker.types.Mount:
    """An NFS file system mount: a volume of Docker's local driver that mounts the export
    (type=nfs, o=addr=<server>,<options>, device=:<export>/<path>) when the container starts."""
    server, _, export = fs.source.partition(":")
    sub = (v.normalized_path(mount.get("path") or "/") or "/").lstrip("/")
    device = ":" + (posixpath.join(export, sub).rstrip("/") if sub else export)
    options = mount.get("options") or v.DEFAULT_NFS_OPTIONS
    return docker.types.Mount(
        target,
        volume_name,
        type="volume",
        read_only=bool(mount.get("read_only")),
        labels=labels,
        no_copy=True,  # the image's files never land on the export
        driver_config=docker.types.DriverConfig(
            "local", options={"type": "nfs", "o": f"addr={server},{options}", "device": device}
        ),
    )


def mounts_for(
    job: TrainingJob, attempt: Attempt, task_run: TaskRun, layout: list[LayoutEntry] | None = None
) -> list[docker.types.Mount]:
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
            mounts.append(
                docker.types.Mount(
                    target,
                    cache_volume(job, task_run),
                    type="volume",
                    labels=volume_labels(job, "cache"),
                    # An image's files at /cache are not copied in: an image with millions of
                    # them would make the create time out (and look like a lost host).
                    no_copy=True,
                )
            )
            continue
        elif entry.kind == Kind.DATASET:
            if entry.ref is None:
                raise StagingError(f"{entry.what} no longer exists.")
            source = str(_storage_source(entry.ref.path, entry.what))
        elif entry.kind in (Kind.OBS, Kind.ARTIFACTS):
            source = str(_storage_source(entry.ref or "", entry.what))
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
        mounts.append(docker.types.Mount(target, source, type="bind", read_only=ro))
    return mounts
