"""A worker's followers acknowledge their logs together: one statement for all of them.

Every follower writes, for each batch of lines it persisted (and once a heartbeat when there is
none), how far its log file is acknowledged and that it still holds its run (`acknowledge`
below, called from logs.Follower._pump).
Made by each follower on a pooled connection of its own, that was 200 checkouts and 200
statements a second beside 200 instances, each holding its connection while it waited for the
GIL: the worker's 20 connections stayed taken, and a stop's or a restart's queries waited behind
them for 40-400 ms (bench/README.md, "Re-run on 2026-12-03"). Here one thread of the process
writes every acknowledgement waiting at that moment in one UPDATE (a group commit): under load
the batches grow, when idle each is written at once. A follower still waits for its own answer
(its row written, or ownership lost) before it tells the websockets about its lines.

PostgreSQL takes a batch as one `UPDATE ... FROM (VALUES ...) RETURNING`; another database (the
embedded console's SQLite) gets the rows one by one, from the same thread.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from jobs.models import TaskRun

from . import dbpool

log = logging.getLogger(__name__)

MAX_BATCH = 500  # rows in one statement (7 parameters each)

FIELDS = ("log_lines", "log_bytes", "log_last_ts_ns", "log_last_ts_count", "follower_heartbeat")


@dataclass
class _Ack:
    task_run_id: int
    token: uuid.UUID
    values: tuple  # FIELDS' values, in order
    done: threading.Event = field(default_factory=threading.Event)
    written: int = 0
    error: BaseException | None = None


def _values(state: dict) -> tuple:
    return (state["lines"], state["bytes"], state["last_ts"], state["last_ts_count"], timezone.now())


def acknowledge_one(task_run_id: int, token: uuid.UUID, values: tuple) -> int:
    """One follower's row, on this thread's connection; the rows written (0: ownership lost)."""
    return TaskRun.objects.filter(id=task_run_id, follower_token=token).update(**dict(zip(FIELDS, values, strict=True)))


def _column(name: str) -> str:
    return connection.ops.quote_name(TaskRun._meta.get_field(name).column)


_SQL: dict[int, str] = {}  # batch size -> its statement


def _postgresql_sql(size: int) -> str:
    if size not in _SQL:
        types = ("bigint", "uuid", "bigint", "bigint", "bigint", "bigint", "timestamptz")
        row = "(" + ", ".join(f"%s::{t}" for t in types) + ")"
        table = connection.ops.quote_name(TaskRun._meta.db_table)
        names = ("lines", "bytes", "last_ts", "last_ts_count", "beat")
        sets = ", ".join(f"{_column(f)} = v.{n}" for f, n in zip(FIELDS, names, strict=True))
        _SQL[size] = (
            f"UPDATE {table} AS t SET {sets} FROM (VALUES {', '.join([row] * size)}) "
            f"AS v(id, token, {', '.join(names)}) "
            f"WHERE t.{_column('id')} = v.id AND t.{_column('follower_token')} = v.token "
            f"RETURNING t.{_column('id')}, t.{_column('follower_token')}"
        )
    return _SQL[size]


def _write_postgresql(batch: list[_Ack]) -> None:
    sql = _postgresql_sql(len(batch))
    params: list = []
    for ack in batch:
        params.extend((ack.task_run_id, ack.token, *ack.values))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        written = {(run_id, token) for run_id, token in cursor.fetchall()}
    for ack in batch:
        ack.written = 1 if (ack.task_run_id, ack.token) in written else 0


def write(batch: list[_Ack]) -> None:
    """Write a batch of acknowledgements (each ack's `written` set); raises what the database raised."""
    if connection.vendor == "postgresql":
        _write_postgresql(batch)
    else:
        for ack in batch:
            ack.written = acknowledge_one(ack.task_run_id, ack.token, ack.values)


class AckNotWritten(DatabaseError):
    """A follower's acknowledgement could not be written (its cause chained): the follower fails
    as its own query would have, and its run is adopted again."""


def _close_quietly() -> None:
    try:
        connection.close()  # a broken connection is not taken again
    except Exception:
        log.exception("closing the acknowledgement writer's connection failed")


def write_or_isolate(batch: list[_Ack]) -> None:
    """Write the batch; should its statement fail (a connection that broke, a row the database
    refuses, a deadlock with another statement on these rows), write the rows one by one, so
    that only a follower whose own row fails gets the error (and a broken connection is not
    used again)."""
    try:
        write(batch)
        return
    except Exception as exc:
        log.warning("writing %d acknowledgements together failed, one by one now: %s", len(batch), exc)
        _close_quietly()
    for ack in batch:
        try:
            ack.written = acknowledge_one(ack.task_run_id, ack.token, ack.values)
        except Exception as exc:
            ack.error = exc
            _close_quietly()


class AckWriter:
    """The process's writer of acknowledgements: a thread, started with the first one (and
    again, should it ever have ended)."""

    def __init__(self) -> None:
        self._pending: list[_Ack] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False

    def acknowledge(self, task_run_id: int, token: uuid.UUID, state: dict) -> int:
        """Queue one follower's acknowledgement and wait for it: the rows written (0: lost).
        Waits at most FOLLOWER_STALE_AFTER_S: later, another worker may have adopted the run."""
        ack = _Ack(task_run_id, token, _values(state))
        with self._cond:
            self._pending.append(ack)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._write_forever, name="ack-writer", daemon=True)
                self._thread.start()
            self._cond.notify()
        wait_s = settings.FOLLOWER_STALE_AFTER_S
        if not ack.done.wait(wait_s):
            # Written later, it matches nothing: this follower releases its run (token NULL) or
            # another holds it by then.
            raise AckNotWritten(f"task run {task_run_id}'s acknowledgement not written within {wait_s:g} s")
        if ack.error is not None:
            # Its own exception in each thread: one shared object would gather every thread's frames.
            raise AckNotWritten(f"task run {task_run_id}'s acknowledgement: {ack.error}") from ack.error
        return ack.written

    def close(self) -> None:
        """End the thread once nothing waits (a test's writer; a worker's lives as long as it)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()  # every thread that ever wrote for it (a replaced one may still wait)
        if self._thread is not None:
            self._thread.join(10)

    def _take(self) -> list[_Ack]:
        with self._cond:
            while not self._pending and not self._closing:
                self._cond.wait()
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            return batch

    def _write_forever(self) -> None:
        while True:
            batch = self._take()
            if not batch:  # closing
                _close_quietly()
                return
            try:
                write_or_isolate(batch)
            except Exception as exc:  # nothing may end this thread: every follower waits on it
                log.exception("writing acknowledgements failed")
                for ack in batch:
                    ack.error = ack.error or exc
            finally:
                for ack in batch:
                    ack.done.set()
            with self._cond:
                idle = not self._pending
            if idle:
                try:
                    dbpool.release_connection_if_pooled()  # kept while the next batch waits already
                except Exception:
                    log.exception("giving the acknowledgement writer's connection back failed")


_writer: AckWriter | None = None
_writer_lock = threading.Lock()


def _forget_after_fork() -> None:
    # A forked child has neither the parent's writer thread nor, safely, its lock.
    global _writer, _writer_lock
    _writer, _writer_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def local_writer() -> AckWriter:
    """This process's writer."""
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = AckWriter()
        return _writer


def acknowledge(task_run_id: int, token: uuid.UUID, state: dict) -> int:
    """Write a follower's acknowledged length and heartbeat while it still holds the run; returns
    the rows written (0: ownership lost). Inside a transaction (a test's), on its own connection:
    the writer's could not see the transaction's rows."""
    if connection.in_atomic_block:
        return acknowledge_one(task_run_id, token, _values(state))
    return local_writer().acknowledge(task_run_id, token, state)
