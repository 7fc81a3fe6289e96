"""`docker exec`s: one bounded in time and output (metrics scrapes, nvidia-smi, stacks), and the
interactive ones: the browser terminal's end in the container (a TTY;
jobs/terminal.py, docs/decisions.md "A terminal in the browser") and the relay to an app the
instance serves on its own loopback (JupyterLab, TensorBoard; jobs/proxy/, docs/decisions.md
"JupyterLab and TensorBoard through the console").

Part of the engine's edge (jobs/runtime/engine.py): it calls the SDK only through the objects
engine hands out and turns its errors into the console's with `engine._edge`, so it does not
import the SDK itself and the one-Docker-boundary rule of tests/test_architecture.py holds.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .engine import BUSYBOX, HOST_ERRORS, MA_USER, Unreachable, _at_edge, _edge

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None: still running when we stopped reading (it is killed by its timeout)
    stdout: bytes
    stderr: bytes
    truncated: bool = False  # more output than max_bytes: the rest was not read
    timed_out: bool = False  # ended by the timeout (exit 137 from `timeout -s KILL`, or the socket's)


STDOUT_FRAME, STDERR_FRAME = 1, 2  # the stream byte of Docker's multiplexed frames


def read_past_headers(raw) -> bytes:
    """The bytes of an exec's stream that came with the engine's `101 Switching Protocols` and
    that the HTTP parser read with its headers (a buffered read takes what is there): the SDK
    hands out the socket under that buffer, so a caller reading the socket alone lost them. A
    command that ended at once lost its whole output (exit 0, nothing printed: a metrics scrape
    with no samples, under a busy worker; tests/test_exec_stream.py); a terminal its first line,
    a relay an app's greeting. Takes only what the buffer holds, or what one read without waiting
    gives."""
    response = getattr(raw, "_response", None)
    buffered = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    sock = getattr(raw, "_sock", raw)
    if buffered is None or not hasattr(sock, "gettimeout"):
        return b""
    if not isinstance(getattr(buffered, "raw", None), socket.SocketIO):
        # Not a socket under the buffer (an ssh:// host's pipe to its ssh process): a read here
        # would wait until the command spoke, and a timeout of 0 does not reach a pipe.
        return b""
    timeout = sock.gettimeout()
    try:
        sock.settimeout(0)
        return buffered.read1(65536) or b""
    except OSError:  # nothing there (a TLS socket says so with an error)
        return b""
    finally:
        sock.settimeout(timeout)


def multiplexed_frames(first: bytes, sock) -> Iterator[tuple[int, bytes]]:
    """(stream, payload) of each frame of an exec without a TTY: `first` (read_past_headers),
    then what the socket gives, until it ends. A read that times out raises (OSError)."""
    buffer = first

    def fill(size: int) -> bool:
        nonlocal buffer
        while len(buffer) < size:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            buffer += chunk
        return True

    while fill(8):
        kind, size = buffer[0], int.from_bytes(buffer[4:8], "big")
        if not fill(8 + size):
            return
        yield kind, buffer[8 : 8 + size]
        buffer = buffer[8 + size :]


@_at_edge
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
    # Every request of it bounded by its own timeout, never its client's: a follower's client has
    # none (its log may be silent for hours), and the hang watch's GPU reading and the stacks of a
    # hang run through a follower's handle; an engine that took the create and never answered held
    # that thread for good.
    call_s = seconds + 2
    created = api._post_json(
        api._url("/containers/{0}/exec", container.id),
        data={"AttachStdout": True, "AttachStderr": True, "Tty": False, "User": user, "Cmd": wrapped},
        timeout=call_s,
    )
    exec_id = api._result(created, json=True)["Id"]
    out, err = bytearray(), bytearray()
    truncated = timed_out = False
    # exec_start without its client's timeout (a follower's client has none): this request's
    # socket reads time out a little after the command's own timeout.
    response = api._post_json(
        api._url("/exec/{0}/start", exec_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        data={"Tty": False, "Detach": False},
        stream=True,
        timeout=call_s,
    )
    raw = api._get_raw_response_socket(response)
    try:
        for kind, chunk in multiplexed_frames(read_past_headers(raw), getattr(raw, "_sock", raw)):
            if time.monotonic() > deadline:
                timed_out = True
                break
            buf = err if kind == STDERR_FRAME else out
            room = max_bytes - len(buf)
            if len(chunk) > room:
                truncated = True
            buf.extend(chunk[: max(0, room)])
            if truncated:
                break  # the command is killed by its timeout if it goes on printing
    except TimeoutError as exc:  # the socket's read timed out: the command did not answer in time
        timed_out = True
        log.info("exec %s in %s: %s", cmd[:2], container.name, exc)
    # Any other OSError (the connection reset or refused: the engine went away mid-answer) is the
    # engine's, not the command's: the edge raises it as Unreachable.
    finally:
        _shut(getattr(raw, "_sock", raw))
        response.close()
    code = api._result(api._get(api._url("/exec/{0}/json", exec_id), timeout=call_s), json=True).get("ExitCode")
    if code == 137 and not truncated:
        timed_out = True  # killed by `timeout -s KILL` (or by the OOM killer: either way, no answer)
    return ExecResult(code, bytes(out), bytes(err), truncated, timed_out)


def _shut(sock) -> None:
    """Shut an upgraded connection down (the engine then closes the exec's streams)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


# The image's own shell, as for the user's command (the launcher runs it by that path); an image
# without one gets the console's static busybox sh. `-i`: a prompt and job control on the TTY.
# First, on the console's own sh, the first line names the process, which stays the TTY's
# session leader through `exec`: the session that close() hangs up (Docker leaves an exec with a
# TTY running when its connection closes). Nothing of the job runs before that line is printed.
PREAMBLE = b"console-terminal "
SHELL = [
    BUSYBOX,
    "sh",
    "-c",
    f'echo "{PREAMBLE.decode()}$$"; if [ -x /bin/sh ]; then exec /bin/sh -i; fi; exec {BUSYBOX} sh -i',
]
# Run as MA_USER on close: SIGHUP to every process of the terminal's session (what a terminal's
# hangup does), SIGKILL to what is left 2 s later; a process started with `setsid` is not in it.
# /proc/<pid>/stat: "pid (comm) state ppid pgrp session ..."; comm is the job's to choose, so
# the fields are taken after its last ") ".
HANG_UP = """
sid=$1
signal_session() {
  for f in /proc/[0-9]*/stat; do
    read -r line < "$f" 2>/dev/null || continue
    set -- ${line##*) }
    if [ "$4" = "$sid" ]; then p=${f#/proc/}; kill -"$sig" "${p%/stat}" 2>/dev/null; fi
  done
}
sig=HUP; signal_session; sleep 2; sig=KILL; signal_session
"""
READ_BYTES = 64 * 1024
# A write that the container does not take within this long (a program that never reads its
# stdin, and a paste that filled every buffer on the way) fails instead of holding the caller.
WRITE_TIMEOUT_S = 10.0


class ExecSession:
    """One exec with a TTY: `read()` and `write()` its raw bytes (one reader thread, one writer
    at a time), `resize()` its TTY, `close()` from any thread (a blocked `read()` then returns b"")."""

    def __init__(self, container, exec_id: str, raw):
        self._container, self._api, self.exec_id = container, container.client.api, exec_id
        self._raw = raw  # the SDK's wrapper: holds the HTTP response that owns the connection
        # A unix or TCP connection gives a SocketIO whose `_sock` is the socket; an SSH host a channel.
        self._sock = getattr(raw, "_sock", raw)
        self._sock.settimeout(WRITE_TIMEOUT_S)
        self._closed = threading.Event()
        self._pending = b""  # read past the preamble: the shell's first output
        self.session_id: int | None = None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _read_preamble(self) -> None:
        """Read the wrapper's first line (its PID); raises Unreachable if it does not come."""
        data = read_past_headers(self._raw)  # it may have come with the engine's answer
        while b"\n" not in data and len(data) < 256:
            with _edge():
                chunk = self._sock.recv(256)
            if not chunk:
                break
            data += chunk
        line, _, rest = data.partition(b"\n")
        line = line.strip()
        if not line.startswith(PREAMBLE) or not line[len(PREAMBLE) :].isdigit():
            raise Unreachable(f"the terminal did not start: {data[:80]!r}")
        self.session_id, self._pending = int(line[len(PREAMBLE) :]), rest

    def read(self, size: int = READ_BYTES) -> bytes:
        """The next bytes the TTY printed; b"" when the exec ended or the session was closed."""
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        while not self._closed.is_set():
            try:
                return self._sock.recv(size)
            except TimeoutError:
                continue  # a quiet shell: the timeout is for writes
            except OSError:
                return b""
        return b""

    def write(self, data: bytes) -> None:
        """Keystrokes into the TTY; raises the console's Unreachable if the container does not
        take them within WRITE_TIMEOUT_S or the exec has ended."""
        with _edge():
            self._sock.sendall(data)

    def resize(self, rows: int, cols: int) -> None:
        with _edge():
            self._api.exec_resize(self.exec_id, height=rows, width=cols)

    def close(self, *, hang_up: bool = True) -> None:
        """Close the connection and hang up the terminal's session in the container (blocks up to
        a few seconds: call it off the server's loop). Once only; later calls do nothing."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread
        except OSError:
            pass
        for thing in (self._sock, self._raw):
            try:
                thing.close()
            except OSError:
                pass
        if hang_up and self.session_id is not None:
            try:
                exec_bounded(self._container, [BUSYBOX, "sh", "-c", HANG_UP, "sh", str(self.session_id)], timeout_s=5)
            except HOST_ERRORS as exc:  # the container ended meanwhile: nothing of it is left
                log.info("terminal %s: hang-up: %s", self.exec_id[:12], exc)


def open_terminal(container, *, rows: int = 24, cols: int = 80, workdir: str | None = None) -> ExecSession:
    """Start the shell in the container as MA_USER (uid 1000, the job's user) with a TTY.

    It runs in the job's own namespaces (network, PIDs, mounts) under the container's
    no-new-privileges, in the image's working dir unless `workdir` is given. Raises
    HOST_ERRORS (engine) when the engine refuses or cannot be asked.
    """
    with _edge():
        api = container.client.api
        exec_id = api.exec_create(
            container.id,
            SHELL,
            stdin=True,
            tty=True,
            user=MA_USER,
            # No COLUMNS/LINES: they would override the TTY's size after a resize (busybox, bash).
            environment={"TERM": "xterm-256color"},
            workdir=workdir,
        )["Id"]
        raw = api.exec_start(exec_id, tty=True, socket=True)
    session = ExecSession(container, exec_id, raw)
    try:
        session._read_preamble()
        session.resize(rows, cols)
    except BaseException:
        session.close()
        raise
    return session


# -- a TCP relay to the instance's loopback ------------------------------------------------------------
# The console's own nc (the static busybox, never the image's), as the job's user, in the job's
# network namespace: the instance's 127.0.0.1 is reached from inside, so the console needs no
# route to a job (single instances have network "none") and no port is published anywhere.
RELAY_CONNECT_TIMEOUT_S = 5
_STREAM_STDOUT, _STREAM_STDERR = 1, 2


class Relay:
    """One TCP connection to 127.0.0.1:<port> in the container: `write()` bytes to it, `read()`
    what it answers (Docker's multiplexed stream, demultiplexed: the app's bytes are stdout, nc's
    own complaints stderr), b"" once it closed. `close()` from any thread."""

    def __init__(self, exec_id: str, raw):
        self.exec_id, self._raw = exec_id, raw
        self._sock = getattr(raw, "_sock", raw)
        self._buffer = read_past_headers(raw)  # an app's greeting may have come with the engine's answer
        self._sock.settimeout(WRITE_TIMEOUT_S)
        self.stderr = b""  # nc's messages ("can't connect"), bounded
        self._closed = threading.Event()

    def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                chunk = self._sock.recv(READ_BYTES)
            except TimeoutError:
                if self._closed.is_set():
                    return False
                continue
            except OSError:
                return False
            if not chunk:
                return False
            self._buffer += chunk
        return True

    def read(self) -> bytes:
        """The app's next bytes; b"" at the end of the connection."""
        while not self._closed.is_set():
            if not self._fill(8):
                return b""
            kind, size = self._buffer[0], int.from_bytes(self._buffer[4:8], "big")
            if not self._fill(8 + size):
                return b""
            payload, self._buffer = self._buffer[8 : 8 + size], self._buffer[8 + size :]
            if kind == _STREAM_STDOUT:
                if payload:
                    return payload
            elif kind == _STREAM_STDERR:
                self.stderr = (self.stderr + payload)[-4096:]
        return b""

    def write(self, data: bytes) -> None:
        with _edge():
            self._sock.sendall(data)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for thing in (self._sock, self._raw):
            try:
                thing.close()
            except OSError:
                pass


def open_relay(container, port: int) -> Relay:
    """A connection to `port` on the instance's loopback through an exec of the console's nc.
    Raises HOST_ERRORS when the engine refuses (the container ended) or cannot be asked."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port}")
    with _edge():
        api = container.client.api
        exec_id = api.exec_create(
            container.id,
            [BUSYBOX, "nc", "-w", str(RELAY_CONNECT_TIMEOUT_S), "127.0.0.1", str(port)],
            stdin=True,
            tty=False,
            user=MA_USER,
        )["Id"]
        raw = api.exec_start(exec_id, tty=False, socket=True)
    return Relay(exec_id, raw)
