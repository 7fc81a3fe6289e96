"""Pipes read and written as a socket is: each read, and each write, waits no longer than the
socket's timeout. The engine's ssh:// transport reads the `ssh` client's stdout and writes its
stdin with them (jobs/runtime/engine.py, docs/decisions.md "An ssh:// engine that works, and
times out")."""

from __future__ import annotations

import io
import math
import os
import select
import threading
import time
from typing import Protocol


class TimedSocket(Protocol):
    def gettimeout(self) -> float | None: ...


class PipeReader(io.RawIOBase):
    """The ssh client's stdout read as a socket with a timeout is: a read that waits longer than
    the socket's timeout raises TimeoutError. The SDK reads the pipe with no timeout at all, so a
    call to an ssh:// engine that stopped answering held its caller for ever (a control task's
    thread, a stop) where a unix or tcp:// engine's call times out.

    The pipe is closed here (`end`), never under a read: a read after it gives the end (b""), not
    whatever the descriptor's number has since been given to (another connection's pipe)."""

    def __init__(self, pipe, sock: TimedSocket):
        # `_sock`: where the SDK's CancellableStream looks for the socket to shut down.
        self._pipe, self._fd, self._sock = pipe, pipe.fileno(), sock
        self._lock = threading.Lock()  # held by a read, and by the close of the pipe
        self._ended = False

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer) -> int:
        with self._lock:
            if self._ended:
                return 0
            timeout = self._sock.gettimeout()
            # poll, not select: select cannot wait on a descriptor numbered 1024 or more (a worker
            # following hundreds of instances has that many open).
            try:
                waiting = select.poll()
                waiting.register(self._fd, select.POLLIN)
                if not waiting.poll(None if timeout is None else math.ceil(timeout * 1000)):
                    raise TimeoutError("timed out")
                data = os.read(self._fd, len(buffer))
                buffer[: len(data)] = data
                return len(data)
            finally:
                if self._ended and not self._pipe.closed:  # `end` gave up waiting for this read
                    self._pipe.close()

    def has_input(self) -> bool:
        """Whether a read would return at once (bytes, or the end), without reading: an idle
        connection's pipe that has is no longer fit for a request. True once ended, or while a
        read is under way."""
        if not self._lock.acquire(blocking=False):
            return True
        try:
            if self._ended:
                return True
            waiting = select.poll()
            waiting.register(self._fd, select.POLLIN)
            return bool(waiting.poll(0))
        finally:
            self._lock.release()

    def end(self) -> None:
        """Close the pipe once no read is under way: the ssh process has been told to end, so a
        read waiting on it returns. One that does not within 5 s closes the pipe itself."""
        self._ended = True
        if self._lock.acquire(timeout=5):
            try:
                self._pipe.close()
            except OSError:
                pass
            finally:
                self._lock.release()


class PipeWriter:
    """The ssh client's stdin written as a socket with a timeout is: a write that waits for room
    longer than the socket's timeout raises TimeoutError. The SDK wrote the pipe blocking, so a
    request body (an archive put into a container, a relay's bytes) to an ssh that stopped reading
    held its caller for ever. The pipe is made non-blocking: a write takes what fits, then waits
    (poll) for room until the timeout.

    The pipe is closed here (`end`), never under a write (the lock), so a write after it is a
    broken pipe, not bytes into whatever the descriptor's number was given to next. A write
    waiting without a timeout ends once the ssh process does (end's caller ends it first)."""

    def __init__(self, pipe, sock: TimedSocket):
        self._pipe, self._fd, self._sock = pipe, pipe.fileno(), sock
        self._lock = threading.Lock()  # held by a write, and by the close of the pipe
        self._ended = False
        os.set_blocking(self._fd, False)  # this end's own: the ssh process reads its end blocking

    def write(self, data) -> int:
        # The views released at once: the caller's buffer (a bytearray) may be resized next.
        with self._lock, memoryview(data) as whole, whole.cast("B") as view:
            if self._ended:
                raise BrokenPipeError("the pipe to the ssh process is closed")
            timeout = self._sock.gettimeout()
            deadline = None if timeout is None else time.monotonic() + timeout
            waiting = select.poll()
            waiting.register(self._fd, select.POLLOUT)
            written = 0
            try:
                while written < len(view):
                    try:
                        written += os.write(self._fd, view[written:])  # a reader gone: BrokenPipeError
                        continue
                    except BlockingIOError:
                        pass
                    left_ms = None if deadline is None else max(0, math.ceil((deadline - time.monotonic()) * 1000))
                    if not waiting.poll(left_ms):
                        raise TimeoutError("timed out")
                return written
            finally:
                if self._ended and not self._pipe.closed:  # `end` gave up waiting for this write
                    try:
                        self._pipe.close()
                    except OSError:
                        pass

    def end(self) -> None:
        """Close the pipe once no write is under way; one that still waits after 5 s closes it
        itself when it ends."""
        self._ended = True
        if self._lock.acquire(timeout=5):
            try:
                self._pipe.close()
            except OSError:
                pass
            finally:
                self._lock.release()
