"""Interactive `docker exec`s: the browser terminal's end in the container (a TTY;
jobs/terminal.py, docs/decisions.md "A terminal in the browser") and the relay to an app the
instance serves on its own loopback (JupyterLab, TensorBoard; jobs/proxy/, docs/decisions.md
"JupyterLab and TensorBoard through the console").

Part of the engine's edge (jobs/runtime/engine.py): it calls the SDK only through the objects
engine hands out and turns its errors into the console's with `engine._edge`, so it does not
import the SDK itself and the one-Docker-boundary rule of tests/test_architecture.py holds.
"""

from __future__ import annotations

import logging
import socket
import threading

from .engine import BUSYBOX, HOST_ERRORS, MA_USER, Unreachable, _edge, exec_bounded, read_past_headers

log = logging.getLogger(__name__)

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
