"""A job's SSH files (SPEC §3 "mutual-trust SSH files", "SSH remote development").

The console writes them into one host directory per job, <JOB_DATA_ROOT>/.ssh/<job id>/,
which jobs/runtime/layout.py binds read-only into every instance of the job:

- mutual trust: a key pair generated once for the job (ed25519), its public key in
  authorized_keys and an ssh config, so that every instance can log in to every other;
- SSH remote development: authorized_keys holding the user's public key.

- SSH remote development also gets a host key of the job's own (ed25519, generated once): the
  launcher runs the image's sshd as ma-user with it on the instance's loopback, the console's
  relay (jobs/ssh_relay.py) reaches it, and the job page shows its fingerprint to check.

ssh and sshd refuse key files that are not owned by the user or are open to others, so
everything here is owned by ma-user (uid 1000) with the modes ssh expects (dir 0700, private
key and authorized_keys 0600). That takes a console running as root (or as uid 1000): unlike
the other directories of a job (staging.give_to_ma_user) these are never opened to everyone
instead, which would hand the private key to every user of the host.

Every file operation goes through the folder's descriptor (jobs/runtime/hostpaths.py): nothing on
the way from JOB_DATA_ROOT is followed if it is a link, and no file is written through one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from . import hostpaths

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
HOST_KEY = "ssh_host_ed25519_key"
# Where the launcher's sshd listens on the instance's loopback (ma-user may not bind 22).
SSHD_PORT = 2222


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

    def write_key_pair(folder: int) -> None:
        private, public = generate_key_pair(f"{MA_USER_NAME}@{job.name}-{str(job.id)[:8]}")
        _write(folder, PRIVATE_KEY, private, 0o600)
        _write(folder, PUBLIC_KEY, public, 0o644)

    with _created_once(job, write_key_pair) as folder:
        # Derived files are rewritten at each start (same content): a console upgrade or an
        # interrupted earlier write cannot leave them stale.
        _replace(folder, AUTHORIZED_KEYS, hostpaths.read_file(folder, PUBLIC_KEY), 0o600)
        _replace(folder, CONFIG, ssh_config(container_dir, hostnames).encode(), 0o644)
    return target


def prepare_remote_access(job: TrainingJob, public_key: str | None) -> Path:
    """authorized_keys with the user's public key, rewritten at each start so that it follows
    the key pair as it is now (None, the key pair was deleted: an empty file, no access); the
    job's sshd host key, made once."""
    target = ssh_dir_path(job)

    def write_host_key(folder: int) -> None:
        private, public = generate_key_pair(f"{job.name}-{str(job.id)[:8]}")
        _write(folder, HOST_KEY, private, 0o600)
        _write(folder, f"{HOST_KEY}.pub", public, 0o644)

    with _created_once(job, write_host_key) as folder:
        text = (public_key or "").strip()
        _replace(folder, AUTHORIZED_KEYS, (text + "\n" if text else "").encode(), 0o600)
    return target


def host_public_key(job: TrainingJob) -> str:
    """The job's sshd host key line ("ssh-ed25519 AAAA... comment"), '' before its first start."""
    try:
        with hostpaths.open_dir(settings.JOB_DATA_ROOT, f"{SSH_STAGING}/{job.id}") as folder:
            return hostpaths.read_file(folder, f"{HOST_KEY}.pub", max_bytes=4096).decode().strip()
    except (OSError, hostpaths.PathEscape):
        return ""


# -- files owned by ma-user ------------------------------------------------------------------------------
def _own(fd: int, mode: int, shown: str) -> None:
    os.fchmod(fd, mode)
    try:
        os.fchown(fd, MA_UID, MA_GID)
    except PermissionError:
        if os.geteuid() != MA_UID:
            raise PermissionError(
                f"SSH files: {shown} cannot be given to ma-user (uid {MA_UID}); the console must run as root "
                f"or as uid {MA_UID} to hand out SSH keys."
            ) from None


def _write(folder: int, name: str, data: bytes, mode: int) -> None:
    # Created with the final mode (O_EXCL, O_NOFOLLOW: a new file, never through a link): a
    # private key is never readable by others, even for a moment.
    fd = hostpaths.create_file(folder, name, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        _own(f.fileno(), mode, name)


def _replace(folder: int, name: str, data: bytes, mode: int) -> None:
    """Write aside and rename over: a running instance reading the file sees the old or the new one."""
    try:
        same = hostpaths.read_file(folder, name) == data
    except (FileNotFoundError, hostpaths.PathEscape):
        same = False  # missing, or a link: replaced below, never followed
    if same:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        try:
            _own(fd, mode, name)
        finally:
            os.close(fd)
        return
    tmp = f".{name}.{uuid.uuid4().hex[:8]}"
    try:
        _write(folder, tmp, data, mode)
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        try:
            os.unlink(tmp, dir_fd=folder)
        except FileNotFoundError:
            pass


@contextmanager
def _created_once(job: TrainingJob, fill: Callable[[int], None]) -> Iterator[int]:
    """The job's directory (a descriptor of it), made once, filled by `fill`, atomically: instances
    starting at the same time (threads or processes of the worker, several consoles) all end up
    with the one directory that won the rename, never with a half-written or a second key pair."""
    root = Path(settings.JOB_DATA_ROOT)
    root.mkdir(parents=True, exist_ok=True)  # the operator's setting: trusted
    name = str(job.id)
    with hostpaths.open_dir(root, SSH_STAGING, create=True, mode=0o700) as staging:
        os.fchmod(staging, 0o700)  # private keys of every job below: root's alone
        if not hostpaths.is_dir_at(staging, name):
            tmp = hostpaths.make_temp_dir(staging, f".{name}.", 0o700)
            try:
                fd = hostpaths.open_child(staging, tmp)
                try:
                    fill(fd)
                    _own(fd, 0o700, tmp)
                finally:
                    os.close(fd)
                os.rename(tmp, name, src_dir_fd=staging, dst_dir_fd=staging)
            except OSError:
                if not hostpaths.is_dir_at(staging, name):  # not a concurrent start that won the rename
                    raise
            finally:
                try:
                    hostpaths.remove_at(staging, tmp)
                except OSError:
                    pass
        folder = hostpaths.open_child(staging, name, at=f"{SSH_STAGING}/{name}")
    try:
        _own(folder, 0o700, str(ssh_dir_path(job)))
        yield folder
    finally:
        os.close(folder)
