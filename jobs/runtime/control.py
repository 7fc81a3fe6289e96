"""The console's own folders on a Docker host, beside the engine's API (jobs/runtime/engine.py):

- the runtime tools, bound read-only at /.console/bin in every job container: a static busybox of
  the console's own, copied once from settings.STATIC_BUSYBOX;
- the control dir of each container, bound at /.console/run: written by the launcher (root in the
  container) and by the console, never by the job (uid 1000 cannot write it). The trusted
  channel of docs/decisions.md ("A trusted control channel").
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

_tools_lock = threading.Lock()


class ToolsMissing(RuntimeError):
    """No static busybox to give the containers (setup.sh installs Debian's busybox-static)."""


def runtime_tools_dir() -> Path:
    """The host folder bound at /.console/bin: the console's static busybox, copied once from
    settings.STATIC_BUSYBOX. With several Docker hosts this path must exist on each (as the
    job data root does)."""
    folder = Path(settings.RUNTIME_TOOLS_DIR)
    target = folder / "busybox"
    if target.is_file():
        return folder
    with _tools_lock:
        if target.is_file():
            return folder
        source = Path(settings.STATIC_BUSYBOX)
        if not source.is_file():
            raise ToolsMissing(
                f"{source} is missing: install Debian's busybox-static (scripts/setup.sh does) "
                "or set CONSOLE_STATIC_BUSYBOX to a statically linked busybox."
            )
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".busybox.{os.getpid()}.{threading.get_ident()}"
        shutil.copyfile(source, tmp)
        tmp.chmod(0o755)
        os.replace(tmp, target)
    return folder


WAKE_FIFO = "wake"


# -- the control dir -----------------------------------------------------------------------------------
def control_root() -> Path:
    return Path(settings.CONTROL_ROOT)


def control_dir(job_id, container_name: str) -> Path:
    return control_root() / str(job_id) / container_name


def make_control_dir(job_id, container_name: str) -> Path:
    """Create the container's control dir: owned by the console's user, 0755. The launcher
    (root in the container) writes into it; the job's uid 1000 can only read it."""
    if os.geteuid() == 1000:
        # The job's processes are uid 1000: a control dir of that owner would be theirs to write.
        raise ToolsMissing("the console runs as uid 1000, the jobs' user: run it as root or another service user")
    path = control_dir(job_id, container_name)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise
    path.chmod(0o755)
    try:  # the launcher's wake-up (see wake): the console's, 0600, so the job cannot open it
        os.mkfifo(path / WAKE_FIFO, 0o600)
    except FileExistsError:
        pass
    return path


CONTROL_FILE_MAX_BYTES = 4096


def read_control_file(job_id, container_name: str, name: str) -> str | None:
    """A small file of the control dir, or None when it is not there. Never follows a link
    and never reads more than a few KB: written by our launcher, but read with no trust."""
    path = control_dir(job_id, container_name) / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # ELOOP: a link where a file belongs
        log.warning("control file %s refused: %s", path, exc)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, CONTROL_FILE_MAX_BYTES).decode("ascii", errors="replace")
    finally:
        os.close(fd)


def write_control_file(job_id, container_name: str, name: str, text: str, *, mode: int | None = None) -> None:
    """Write whole (a rename), so that the launcher never reads half a decision. `mode`: set as
    given, not masked by the umask (a file the job must read)."""
    folder = control_dir(job_id, container_name)
    tmp = folder / f".{name}.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, folder / name)


def remove_control_file(job_id, container_name: str, name: str) -> None:
    """A file of the control dir gone (one left by an earlier container of the same name)."""
    try:
        os.unlink(control_dir(job_id, container_name) / name)
    except FileNotFoundError:
        pass


def wake(job_id, container_name: str) -> bool:
    """Wake a launcher waiting for a decision, or a standby's for its check or its go
    (faulttolerance/launcher.sh reads its control dir's FIFO): one byte, never blocking. False
    when no launcher holds the FIFO (not waiting yet: it looks for the file before it reads; an
    older launcher without one): after a decision the SIGUSR1 that follows wakes it as before,
    ~14 ms later (Docker's kill call). Made
    by make_control_dir (the launcher makes it for an older control dir); never the job's, which
    cannot write the control dir: a link or a file in its place is refused all the same."""
    path = control_dir(job_id, container_name) / WAKE_FIFO
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:  # ENXIO: no reader; ENOENT; ELOOP: not ours to write
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, b"w")
        return True
    except BlockingIOError:  # EAGAIN: bytes already wait there, the launcher wakes all the same
        return True
    except OSError:  # EPIPE: the reader left between the open and the write; the signal follows
        return False
    finally:
        os.close(fd)


def remove_control_dirs(job_id) -> None:
    shutil.rmtree(control_root() / str(job_id), ignore_errors=True)
