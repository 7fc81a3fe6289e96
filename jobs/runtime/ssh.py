"""A job's SSH files (SPEC §3 "mutual-trust SSH files", "SSH remote development").

The console writes them into one host directory per job, <JOB_DATA_ROOT>/.ssh/<job id>/,
which jobs/runtime/layout.py binds read-only into every instance of the job:

- mutual trust: a key pair generated once for the job (ed25519), its public key in
  authorized_keys and an ssh config, so that every instance can log in to every other;
- SSH remote development: authorized_keys holding the user's public key.

Running sshd is the image's business: the console hands out keys, never a daemon.

ssh and sshd refuse key files that are not owned by the user or are open to others, so
everything here is owned by ma-user (uid 1000) with the modes ssh expects (dir 0700, private
key and authorized_keys 0600). That takes a console running as root (or as uid 1000): unlike
the other directories of a job (layout.give_to_ma_user) these are never opened to everyone
instead, which would hand the private key to every user of the host.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

if TYPE_CHECKING:
    from jobs.models import TrainingJob

MA_UID = MA_GID = 1000  # ma-user (SPEC §8)
MA_USER_NAME = "ma-user"
# Beside the job data dirs (same shared storage, so every host binds the same files), not in one.
SSH_STAGING = ".ssh"
# Where sshd looks for ma-user's keys by default: SSH remote development always uses it.
REMOTE_SSH_DIR = "/home/ma-user/.ssh"
PRIVATE_KEY = "id_ed25519"
PUBLIC_KEY = "id_ed25519.pub"
AUTHORIZED_KEYS = "authorized_keys"
CONFIG = "config"


def ssh_dir_path(job: TrainingJob) -> Path:
    """The host directory bound at the job's SSH dir in each instance (removed by cleanup.py)."""
    return Path(settings.JOB_DATA_ROOT) / SSH_STAGING / str(job.id)


def generate_key_pair(comment: str) -> tuple[bytes, bytes]:
    """A new ed25519 key pair: (private key in OpenSSH format, unencrypted; public key line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + f" {comment}\n".encode()


def ssh_config(container_dir: str, hostnames: Iterable[str]) -> str:
    """ssh config for mutual trust: the job's key for every instance, no host key prompts.

    Host keys are the image's and change with every container, so they are neither checked
    nor remembered (StrictHostKeyChecking no, known hosts /dev/null): the directory is
    read-only, and a prompt would stop a launcher that ssh-es into the other instances.
    IdentityFile names the key by its path, so `ssh -F <dir>/config` also works when the
    directory is not ~/.ssh.
    """
    identity = f"{container_dir.rstrip('/')}/{PRIVATE_KEY}"
    lines = ["# Written by the console: mutual-trust SSH files of this job (the same in every instance)."]
    for name in hostnames:
        lines += [f"Host {name}", f"    HostName {name}", f"    User {MA_USER_NAME}", f"    IdentityFile {identity}"]
    lines += [
        "Host *",
        f"    IdentityFile {identity}",
        "    StrictHostKeyChecking no",
        "    UserKnownHostsFile /dev/null",
        "    LogLevel ERROR",
    ]
    return "\n".join(lines) + "\n"


def prepare_mutual_trust(job: TrainingJob, container_dir: str, hostnames: Iterable[str]) -> Path:
    """The job's mutual-trust files on the host, made at the first start of any instance and
    kept: every instance and every restart gets the same key pair."""
    target = ssh_dir_path(job)

    def write_key_pair(folder: Path) -> None:
        private, public = generate_key_pair(f"{MA_USER_NAME}@{job.name}-{str(job.id)[:8]}")
        _write(folder / PRIVATE_KEY, private, 0o600)
        _write(folder / PUBLIC_KEY, public, 0o644)

    _create_once(target, write_key_pair)
    # Derived files are rewritten at each start (same content): a console upgrade or an
    # interrupted earlier write cannot leave them stale.
    _replace(target / AUTHORIZED_KEYS, (target / PUBLIC_KEY).read_bytes(), 0o600)
    _replace(target / CONFIG, ssh_config(container_dir, hostnames).encode(), 0o644)
    return target


def prepare_remote_access(job: TrainingJob, public_key: str | None) -> Path:
    """authorized_keys with the user's public key, rewritten at each start so that it follows
    the key pair as it is now; None (the key pair was deleted): an empty file, no access."""
    target = ssh_dir_path(job)
    _create_once(target, lambda folder: None)
    text = (public_key or "").strip()
    _replace(target / AUTHORIZED_KEYS, (text + "\n" if text else "").encode(), 0o600)
    return target


# -- files owned by ma-user ------------------------------------------------------------------------------
def _own(path: Path, mode: int) -> None:
    os.chmod(path, mode)
    try:
        os.chown(path, MA_UID, MA_GID)
    except PermissionError:
        if os.geteuid() != MA_UID:
            raise PermissionError(
                f"SSH files: {path} cannot be given to ma-user (uid {MA_UID}); the console must run as root "
                f"or as uid {MA_UID} to hand out SSH keys."
            ) from None


def _write(path: Path, data: bytes, mode: int) -> None:
    # Created with the final mode: a private key is never readable by others, even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    _own(path, mode)


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write aside and rename over: a running instance reading the file sees the old or the new one."""
    if path.is_file() and path.read_bytes() == data:
        _own(path, mode)
        return
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        _write(tmp, data, mode)
        os.rename(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _create_once(target: Path, fill: Callable[[Path], None]) -> None:
    """Make the job's directory once, filled by `fill`, atomically: instances starting at the
    same time (threads or processes of the worker, several consoles) all end up with the one
    directory that won the rename, never with a half-written or a second key pair."""
    if target.is_dir():
        _own(target, 0o700)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.parent.chmod(0o700)  # private keys of every job below: root's alone
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    tmp.mkdir(mode=0o700)
    try:
        fill(tmp)
        _own(tmp, 0o700)
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # not a concurrent start that won the rename
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
