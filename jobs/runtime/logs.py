"""The persisted log of a task run, and the follower that fills it.

Each task run (one instance of one attempt) has an append-only file of records, one per
Docker log frame: `<docker timestamp in ns><flag><the frame's bytes>` (logrecords.py). The
database row holds the acknowledged length (bytes, records as log_lines, last timestamp): a
record is pushed to browsers only after it is in the file and acknowledged, and a follower that
resumes after a crash truncates anything unacknowledged and asks Docker again from the last
acknowledged timestamp, so no record is lost or doubled.
"""

from __future__ import annotations

import calendar
import fcntl
import logging
import os
import queue
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from console import realtime
from jobs.models import TaskRun

from . import dbpool, engine
from .acks import acknowledge
from .logreaders import Reader, ReadInPlace
from .logrecords import NEWLINE_SIGN, LogLine, encode_record, iter_records, read_tail

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 2.0
BEAT_AT_MOST_STALE = 6  # Follower.beating: at most six times the staleness
MAX_BATCH_LINES = 2000
PUSH_MAX_LINES = 500
PUSH_MAX_BYTES = 1024 * 1024
TAIL_MAX_BYTES = 8 * 1024 * 1024  # tail_lines() reads at most this much


def log_path(task_run: TaskRun) -> Path:
    return (
        Path(settings.LOG_ROOT)
        / str(task_run.attempt.job_id)
        / f"attempt-{task_run.attempt.number}-worker-{task_run.index}.log"
    )


_ts_cache: dict[str, int] = {}


def parse_docker_timestamp(ts: str) -> int:
    """'2026-11-29T11:09:29.123456789Z' -> ns since the epoch (fraction may be trimmed)."""
    seconds_part, _, fraction = ts.rstrip("Z").split("+")[0].partition(".")
    base = _ts_cache.get(seconds_part)
    if base is None:
        base = calendar.timegm(time.strptime(seconds_part, "%Y-%m-%dT%H:%M:%S"))
        if len(_ts_cache) > 4096:
            _ts_cache.clear()
        _ts_cache[seconds_part] = base
    return base * 1_000_000_000 + int((fraction + "000000000")[:9])


def docker_time(value: str | None):
    """Docker's RFC 3339 time as an aware datetime; None for Docker's zero time."""
    if not value or value.startswith("0001-"):
        return None
    ns = parse_docker_timestamp(value)
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


def parse_frame(frame: bytes) -> tuple[int, bool, bytes]:
    """A Docker log frame `<RFC 3339 time> <payload>` -> (ts_ns, more, payload without its
    newline); more: the frame did not end with a newline. Never raises (time 0 if unreadable)."""
    head, _, payload = frame.partition(b" ")
    try:
        ts_ns = parse_docker_timestamp(head.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        ts_ns = 0
    more = not payload.endswith(b"\n")
    if not more:
        payload = payload[:-1]
    if b"\n" in payload:  # never from Docker, which splits on newlines: kept visible, one record
        payload = payload.replace(b"\n", NEWLINE_SIGN)
    return ts_ns, more, payload


def split_frame(frame: bytes) -> tuple[int, str]:
    """A Docker log frame -> (ts_ns, the payload as text, without its newline)."""
    ts_ns, _, payload = parse_frame(frame)
    return ts_ns, payload.decode("utf-8", errors="replace")


def read_lines(task_run: TaskRun, after: int = 0, limit: int | None = None) -> list[LogLine]:
    """Acknowledged records numbered after `after` (at most `limit`), one per Docker frame.
    Near the end it reads backwards (bounded by TAIL_MAX_BYTES); from further back it streams
    the file from the start: for tests and tools (log pages read by offset: jobs/logstream.py)."""
    path = log_path(task_run)
    wanted = task_run.log_lines - after
    if task_run.log_bytes == 0 or wanted <= 0:
        return []
    if limit is None and wanted <= 10_000:
        tail = read_tail(path, task_run.log_bytes, task_run.log_lines, wanted, TAIL_MAX_BYTES)
        if tail.records and tail.records[0].number == after + 1:
            return tail.records
    out: list[LogLine] = []
    for record in iter_records(path, 0, task_run.log_bytes):
        if record.number > after:
            out.append(record)
            if limit is not None and len(out) >= limit:
                break
    return out


def tail_lines(task_run: TaskRun, count: int) -> list[LogLine]:
    """The last `count` acknowledged records (fewer when they exceed TAIL_MAX_BYTES)."""
    return read_tail(log_path(task_run), task_run.log_bytes, task_run.log_lines, count, TAIL_MAX_BYTES).records


# The launcher's line when the user's process ended and it waits for a decision: only a hint
# to read the launcher's report (reports.py), since the job can print the same line. Searched
# anywhere in the line: a job that ends without a newline has the marker glued to its text.
PROCESS_EXIT_RE = re.compile(r"\[console\] process exited with code (\d+)( \(oom-killed\))?;")
# The launcher's first line of a process-level restart, naming the attempt it runs.
PROCESS_RESTART_RE = re.compile(r"^\[console\] process restarted in the same container \(run \d+, attempt (\d+)\)")


class ProcessExited(Exception):
    """The user's process ended inside a still-running container (the launcher's report)."""

    def __init__(self, code: int, oom_killed: bool = False):
        super().__init__(code)
        self.code, self.oom_killed = code, oom_killed


class Follower:
    """Follows one container's log into the log file of its current task run.

    follow() returns when the stream ended (the container stopped, or the host
    went away: the caller asks Docker which) or ownership was lost, and raises
    ProcessExited when the launcher reports the user's process ended: the
    stream stays open, and after a process-level restart the caller hands over
    to the next task run of the same container and calls follow() again.
    """

    def __init__(self, task_run_id: int, waiting_exit=None):
        self.task_run_id = task_run_id
        # task run -> ProcessExited | None: the launcher's own report that this run's process
        # ended and the container waits for a decision (follow.py). A marker line in the log
        # only makes the follower ask; the answer never comes from the log.
        self.waiting_exit = waiting_exit or (lambda task_run: None)
        self.token = uuid.uuid4()
        self.lost_ownership = False
        self._stream = None
        self._frames: queue.Queue | ReadInPlace | None = None
        # Frames taken from the reader and not yet persisted: the rest of its last list, and
        # those read past a process-exit marker (put back in front).
        self._pushback: deque = deque()

    # -- claiming -----------------------------------------------------------
    def claim(self, *, ended: bool = False) -> TaskRun | None:
        """Take the run when nobody follows it. ended: a run whose container ended while its
        follower was dead (a worker killed): taken only to persist the rest of its log."""
        stale = timezone.now() - timezone.timedelta(seconds=settings.FOLLOWER_STALE_AFTER_S)
        runs = TaskRun.objects.filter(id=self.task_run_id)
        if ended:
            runs = runs.filter(TaskRun.drainable(), follower_token__isnull=False)
        else:
            runs = runs.filter(state=TaskRun.State.RUNNING)
        claimed = runs.filter(Q(follower_heartbeat__isnull=True) | Q(follower_heartbeat__lt=stale)).update(
            follower_token=self.token, follower_heartbeat=timezone.now()
        )
        if claimed != 1:
            return None
        return TaskRun.objects.select_related("attempt", "attempt__job", "host").get(id=self.task_run_id)

    def handover(self, task_run_id: int) -> TaskRun | None:
        """Continue with the next task run of the same container (process-level restart);
        None when another live follower already has it (reconcile adopted it meanwhile):
        taking it over would leave two followers pumping one file."""
        self.release()
        self.task_run_id = task_run_id
        stale = timezone.now() - timezone.timedelta(seconds=settings.FOLLOWER_STALE_AFTER_S)
        claimed = (
            TaskRun.objects.filter(id=task_run_id)
            .filter(Q(follower_heartbeat__isnull=True) | Q(follower_heartbeat__lt=stale))
            .update(follower_token=self.token, follower_heartbeat=timezone.now())
        )
        if claimed != 1:
            self.lost_ownership = True
            return None
        return TaskRun.objects.select_related("attempt", "attempt__job", "host").get(id=task_run_id)

    def owns(self) -> bool:
        """Whether the run is still this follower's (nobody took it as a stale one meanwhile)."""
        return TaskRun.objects.filter(id=self.task_run_id, follower_token=self.token).exists()

    def release(self) -> None:
        TaskRun.objects.filter(id=self.task_run_id, follower_token=self.token).update(
            follower_token=None, follower_heartbeat=None
        )

    @contextmanager
    def beating(self) -> Iterator[None]:
        """Keep this follower's heartbeat fresh while its thread does something else than reading:
        a decision made here (the failure's log read, the restart started). Its heartbeat stale,
        reconcile's drain took the ended run as one whose follower died and followed the
        container on into that run's log, the next run's lines too."""
        done = threading.Event()
        task_run_id, token = self.task_run_id, self.token

        # Not for ever: a thread stuck in there (an engine that never answers a call without a
        # timeout) would hold the run for good; past this, a drain or a pool may take it, as before.
        beat_until = time.monotonic() + BEAT_AT_MOST_STALE * settings.FOLLOWER_STALE_AFTER_S

        def beat() -> None:
            try:
                while not done.wait(HEARTBEAT_EVERY_S) and time.monotonic() < beat_until:
                    try:
                        TaskRun.objects.filter(id=task_run_id, follower_token=token).update(
                            follower_heartbeat=timezone.now()
                        )
                        dbpool.release_connection_if_pooled()  # not held between beats
                    except Exception as exc:  # a missed beat costs at worst that drain; the next may do
                        log.warning("keeping the heartbeat of task run %s failed: %s", task_run_id, exc)
                        connection.close()  # a broken connection is not taken again
            finally:
                connection.close()  # this thread's own connection: back to the pool, or closed

        thread = threading.Thread(target=beat, name=f"beat-{task_run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def close_stream(self) -> None:
        stream, self._stream, self._frames = self._stream, None, None
        self._pushback.clear()
        if stream is not None:
            stream.close()

    # -- following ----------------------------------------------------------
    def follow(self, task_run: TaskRun, container, on_tick=None, *, ended: bool = False) -> None:
        """ended: the engine said the container ended; read what its log holds, then return."""
        path = log_path(task_run)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o640)
        try:
            try:
                # Two live followers of one file would interleave; the lock
                # dies with its process, so a crashed worker never blocks.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.lost_ownership = True
                return
            # The acknowledged length is the database's, never the caller's copy: following
            # on after the launcher's exit marker with the copy taken when the run was
            # claimed truncated the file to that length (an empty log) and renumbered.
            index = (
                TaskRun.objects.filter(id=self.task_run_id, follower_token=self.token)
                .values("log_lines", "log_bytes", "log_last_ts_ns", "log_last_ts_count")
                .first()
            )
            if index is None:
                self.lost_ownership = True
                return
            for field, value in index.items():
                setattr(task_run, field, value)
            os.ftruncate(fd, task_run.log_bytes)
            os.lseek(fd, task_run.log_bytes, os.SEEK_SET)
            self._pump(task_run, container, fd, on_tick, ended)
        finally:
            os.close(fd)

    def _open_stream(self, task_run: TaskRun, container, ended: bool) -> None:
        if task_run.log_last_ts_ns:
            since = task_run.log_last_ts_ns / 1e9 - 0.001
        elif task_run.reuses_container and task_run.started_at:
            since = task_run.started_at.timestamp() - 0.001
        else:
            since = 0
        self._stream = engine.log_stream(container, since=since, follow=not ended)
        if ended:
            self._frames = ReadInPlace(self._stream)
            return
        self._frames = queue.Queue()
        Reader(self._stream, self._frames).start()

    def _take(self, item: list[bytes] | None) -> None:
        """The reader's next list of frames (or its end, None) behind what is waiting."""
        if item is None:
            self._pushback.append(None)
        else:
            self._pushback.extend(item)

    def _pump(self, task_run: TaskRun, container, fd: int, on_tick, ended_container: bool) -> None:
        # A stream opened here starts before where the run stands; one that goes on (after
        # the launcher's exit marker) continues exactly after the last line taken.
        resumed = self._frames is None
        if resumed:
            self._open_stream(task_run, container, ended_container)
        state = {
            "lines": task_run.log_lines,
            "bytes": task_run.log_bytes,
            "last_ts": task_run.log_last_ts_ns,
            "last_ts_count": task_run.log_last_ts_count,
        }
        # A process-level restart shares the container's log with the runs before it. Handed
        # over at the previous run's exit marker, everything after the marker is its own; on
        # a stream of its own its lines start at the launcher's restart line for its attempt.
        # Not at its started_at: the previous run is ended after that moment, and its exit
        # marker, read as this run's, ended the new attempt too. (A new container's first
        # lines may predate Docker's StartedAt: take all of them.)
        await_start = resumed and task_run.reuses_container and task_run.log_lines == 0
        attempt_number = task_run.attempt.number
        # Lines older than the resume point arrive again when resuming: skip
        # those up to and including what was acknowledged. Only then: later on, an older
        # timestamp is the next chunk of a long line (Docker stamps every chunk of a line with
        # its first one's time) that another stream's line came between, and is kept.
        skip_equal = state["last_ts_count"] if resumed else 0
        resuming = resumed and state["last_ts"] > 0
        last_beat = time.monotonic()
        ended = False
        last_probe = last_beat
        report_seen_at: float | None = None  # the report said "exited" while lines still came
        while not ended:
            batch: list[bytes] = []
            if not self._pushback:
                try:
                    self._take(self._frames.get(timeout=HEARTBEAT_EVERY_S))
                except queue.Empty:
                    pass
            while self._pushback and len(batch) < MAX_BATCH_LINES:
                frame = self._pushback.popleft()
                if frame is None:
                    ended = True
                    break
                batch.append(frame)
                if not self._pushback:
                    try:  # what else came meanwhile, up to a batch
                        self._take(self._frames.get_nowait())
                    except queue.Empty:
                        break
            new_lines: list[LogLine] = []
            chunks: list[bytes] = []
            process_exit: ProcessExited | None = None
            for position, frame in enumerate(batch):
                ts_ns, more, payload = parse_frame(frame)
                text = payload.decode("utf-8", errors="replace")
                if await_start:
                    started = PROCESS_RESTART_RE.match(text)
                    if not started or int(started.group(1)) != attempt_number:
                        continue  # the previous run's, persisted by its own follower
                    await_start = False
                if resuming:
                    if ts_ns < state["last_ts"]:
                        continue
                    if ts_ns == state["last_ts"] and skip_equal > 0:
                        skip_equal -= 1
                        continue
                    resuming = False
                if ts_ns == state["last_ts"]:
                    state["last_ts_count"] += 1
                elif ts_ns > state["last_ts"]:
                    state["last_ts"], state["last_ts_count"] = ts_ns, 1
                state["lines"] += 1
                chunks.append(encode_record(ts_ns, more, payload))
                offset = new_lines[-1].end if new_lines else state["bytes"]
                new_lines.append(LogLine(state["lines"], ts_ns, payload, more, offset, len(chunks[-1])))
                if PROCESS_EXIT_RE.search(text) and (reported := self.waiting_exit(task_run)) is not None:
                    # The launcher's marker of a reported exit: lines after it belong to whatever
                    # comes next; put them back in front of the queue's remaining frames.
                    process_exit = reported
                    self._pushback.extendleft(reversed(batch[position + 1 :] + ([None] if ended else [])))
                    ended = False
                    break
            now = time.monotonic()
            # Not for the end alone: the caller asks the engine next and reads the rest of the log
            # (which checks it still holds the run); a heartbeat there was one more wait for the
            # acknowledgement writer between a container's end and its attempt's decision.
            if new_lines or now - last_beat >= HEARTBEAT_EVERY_S or process_exit is not None:
                if chunks:
                    data = b"".join(chunks)
                    os.write(fd, data)
                    state["bytes"] += len(data)
                acknowledged = acknowledge(self.task_run_id, self.token, state)
                last_beat = now
                if acknowledged != 1:
                    self.lost_ownership = True
                    return
                if new_lines:
                    push_lines(task_run, new_lines)
            if process_exit is not None:
                raise process_exit
            if not ended and (not batch or now - last_probe >= HEARTBEAT_EVERY_S):
                # A reported exit whose marker never came as a line of its own (glued to a
                # partial line, acknowledged before a crash, or drowned by a daemon that goes on
                # printing) is taken a heartbeat after the report was first seen, the stream quiet
                # since or not. Not at once, even after a quiet heartbeat: the launcher writes its
                # report, then prints the marker, and the run's last lines (printed just before
                # its exit) may still be on their way. Taken at once, a quiet job's last line (the
                # signature its failure is classified by) was read after the decision.
                last_probe = now
                reported = self.waiting_exit(task_run)
                if reported is None:
                    report_seen_at = None
                elif report_seen_at is None:
                    report_seen_at = now
                elif not batch or now - report_seen_at >= HEARTBEAT_EVERY_S:
                    raise reported
            if on_tick is not None and not ended:
                on_tick(task_run, bool(new_lines))
        self.close_stream()


def push_lines(task_run: TaskRun, lines: list[LogLine]) -> None:
    """Tell the log's websockets about acknowledged records: parts of at most PUSH_MAX_LINES
    records or about PUSH_MAX_BYTES, each with where its first record starts in the file
    (offset: a consumer that missed a part reads it from there); records as [ts_ns, more,
    payload bytes] (jobs/logstream.py push_records)."""
    group = realtime.log_group(task_run.attempt.job_id, task_run.index)
    start = 0
    while start < len(lines):
        stop, size = start, 0
        while stop < len(lines) and stop - start < PUSH_MAX_LINES and (size < PUSH_MAX_BYTES or stop == start):
            size += lines[stop].size
            stop += 1
        part = lines[start:stop]
        realtime.publish(
            group,
            {
                "type": "log.lines",
                "task_run": task_run.id,
                "attempt": task_run.attempt.number,
                "first": part[0].number,
                "offset": part[0].offset,
                "lines": [[line.ts_ns, line.more, line.payload] for line in part],
            },
        )
        start = stop


def recent_text(task_run: TaskRun, count: int = 50) -> tuple[str, ...]:
    """The text of the last `count` lines as a terminal shows them (progress bars in their last
    state, colours stripped), from a bounded tail: what failure classification reads."""
    from .logview import tail_texts  # logview renders through the terminal, which reads records

    return tuple(tail_texts(task_run, count))
