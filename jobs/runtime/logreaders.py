"""Where a follower (logs.Follower) takes a container's log frames from, as lists of the frames that
arrived together: a reader thread's queue for a followed log (the follower's loop waits on it with
a timeout, for its heartbeats), or the follower's own thread for the rest of an ended container's
log (nothing left to wait for)."""

from __future__ import annotations

import logging
import queue
import threading

from . import engine

log = logging.getLogger(__name__)


class ReadInPlace:
    """An ended container's rest of the log, read by the follower's own thread as the queue of a
    Reader would give it: no thread and no hand-over between two on the path from a container's
    end to its attempt's decision. What is left is there already; each wait for it is bounded
    (engine.LOG_REST_TIMEOUT_S).

    The engine's errors are raised, not taken for the end: the follower asks whether the host is
    still there and reads the rest again from the last line taken (a run marked exited on a
    broken read lost the lines after it)."""

    def __init__(self, stream):
        self._batches = stream.batches()
        self._error: engine.EngineError | None = None

    def get(self, timeout: float | None = None) -> list[bytes] | None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return next(self._batches, None)

    def get_nowait(self) -> list[bytes] | None:
        """What else came, up to a batch. An error is kept for the next get(): the frames taken
        before it are written and acknowledged first (an engine that breaks off at the same
        place each time still gives a little more each time)."""
        if self._error is not None:
            raise queue.Empty
        try:
            return next(self._batches, None)
        except engine.EngineError as exc:
            self._error = exc
            raise queue.Empty from None


class Reader(threading.Thread):
    """Moves frames from Docker's log stream into a queue, in lists of the frames that arrived
    together (one hand-over between the threads per read, not per line); None marks the end."""

    def __init__(self, stream, out: queue.Queue):
        super().__init__(daemon=True, name="log-reader")
        self.stream, self.out = stream, out

    def run(self) -> None:
        try:
            for frames in self.stream.batches():
                self.out.put(frames)
        except Exception as exc:  # the host went away mid-stream
            log.info("log stream ended with %r", exc)
        finally:
            self.out.put(None)
