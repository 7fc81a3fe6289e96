"""What a job's containers see where (SPEC §3 "runtime environment preview", SPEC §8).

One description, two uses, so that the preview and the containers never differ:

- `runtime_layout(job)` lists every directory of the job's containers: the local code
  dir (MA_JOB_DIR) and the code folder in it, datasets, the object storage mount, file
  system mounts, the TensorBoard / MindStudio Insight summary dir (MA_SUMMARY_DIR),
  artifacts, the SSH dir (mutual-trust files or SSH remote development), the job data
  dir and /cache. It works for an unsaved job (the create wizard shows it before
  submitting); it only reads the catalogue (datasets, file systems, key pairs).
- staging.py makes on the host what those entries need when a container is created and
  turns the same entries into Docker mounts.

This module is pure: it reads the catalogue, never the host's folders or Docker.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobs import validators as v
from jobs.models import DATA_MOUNT_ROOT, Dataset, FileSystem, KeyPair

from . import ssh

if TYPE_CHECKING:
    from jobs.models import TrainingJob

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
