"""The console's edge with the Docker engine: what every caller needs to talk to a
container without trusting it.

- `HOST_ERRORS`: what a call raises when the engine (or the host) cannot answer.
- The runtime tools: a static busybox of the console's own, bind-mounted read-only
  at `/.console/bin` in every job container. The launcher runs on it (as root, before
  it drops to ma-user for the user's command), and every exec the console runs uses
  its `timeout`, so no control path depends on what the job's image contains.
- The control dir: one host folder per container, bound at `/.console/run`, written by
  the launcher (root) and by the console, never by the job (uid 1000 cannot write it).
  It is the trusted channel of docs/decisions.md ("A trusted control channel").
- `exec_bounded`: a `docker exec` with a timeout enforced inside the container (the
  tools' `timeout`) and on the socket, whose output is read up to a cap.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import requests
from django.conf import settings

log = logging.getLogger(__name__)

HOST_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)

TOOLS_MOUNT = "/.console/bin"
BUSYBOX = f"{TOOLS_MOUNT}/busybox"
CONTROL_MOUNT = "/.console/run"
# The console's own mounts in every container, beside the job's layout (read-only, read-write).
CONSOLE_MOUNTS = {TOOLS_MOUNT: False, CONTROL_MOUNT: True}
ROOT_USER = "0:0"
MA_USER = "1000:1000"

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


def write_control_file(job_id, container_name: str, name: str, text: str) -> None:
    """Write whole (a rename), so that the launcher never reads half a decision."""
    folder = control_dir(job_id, container_name)
    tmp = folder / f".{name}.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, folder / name)


def remove_control_dirs(job_id) -> None:
    shutil.rmtree(control_root() / str(job_id), ignore_errors=True)


# -- exec ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None: still running when we stopped reading (it is killed by its timeout)
    stdout: bytes
    stderr: bytes
    truncated: bool = False  # more output than max_bytes: the rest was not read
    timed_out: bool = False  # ended by the timeout (exit 137 from `timeout -s KILL`, or the socket's)


def exec_bounded(
    container, cmd: list[str], *, user: str = MA_USER, timeout_s: float = 10, max_bytes: int = 1024 * 1024
) -> ExecResult:
    """Run `cmd` in the container and return its status and at most `max_bytes` of its output.

    The command runs under the console's `timeout -s KILL` (from the runtime tools, not
    the image), and the socket read times out a few seconds later, so a command that
    hangs or never stops printing cannot hold the caller. Raises HOST_ERRORS when the
    engine cannot be asked.
    """
    seconds = max(1, math.ceil(timeout_s))
    # The whole call's deadline, on the console's side: the job can kill the `timeout` watcher
    # (it runs as uid 1000 in the container) and trickle output under the socket's timeout.
    deadline = time.monotonic() + seconds + 2
    api = container.client.api
    wrapped = [BUSYBOX, "timeout", "-s", "KILL", str(seconds), *cmd]
    exec_id = api.exec_create(container.id, wrapped, user=user)["Id"]
    out, err = bytearray(), bytearray()
    truncated = timed_out = False
    # exec_start without its client's timeout (a follower's client has none): this request's
    # socket reads time out a little after the command's own timeout.
    response = api._post_json(
        api._url("/exec/{0}/start", exec_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        data={"Tty": False, "Detach": False},
        stream=True,
        timeout=seconds + 2,
    )
    api._raise_for_status(response)
    stream = docker.types.CancellableStream(api._read_from_socket(response, True, tty=False, demux=True), response)
    try:
        for chunk_out, chunk_err in stream:
            if time.monotonic() > deadline:
                timed_out = True
                break
            for buf, chunk in ((out, chunk_out), (err, chunk_err)):
                if chunk:
                    room = max_bytes - len(buf)
                    if len(chunk) > room:
                        truncated = True
                    buf.extend(chunk[: max(0, room)])
            if truncated:
                break  # the command is killed by its timeout if it goes on printing
    except (OSError, requests.exceptions.ConnectionError) as exc:  # the socket's read timed out
        timed_out = True
        log.info("exec %s in %s: %s", cmd[:2], container.name, exc)
    finally:
        stream.close()
    code = api.exec_inspect(exec_id).get("ExitCode")
    if code == 137 and not truncated:
        timed_out = True  # killed by `timeout -s KILL` (or by the OOM killer: either way, no answer)
    return ExecResult(code, bytes(out), bytes(err), truncated, timed_out)
