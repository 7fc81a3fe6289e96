"""A shell in a running instance, over a websocket: `/ws/jobs/<job id>/terminal/<index>/`
(docs/decisions.md "A terminal in the browser").

Framing:
- browser -> console, binary frame: bytes for the TTY (keystrokes, a paste), as typed.
- browser -> console, text frame: one JSON control object; `{"resize": [rows, cols]}` sizes the
  TTY. Keystrokes never travel as text, so nothing a user types or pastes can be read as control.
- console -> browser, binary frame: what the TTY printed, raw bytes (xterm.js decodes them).
- console -> browser, text frame: `{"ended": "<why>", "code": <close code>}`, right before the
  console closes (the code again: a page whose close frame was lost sees 1006, not ours).
- Close codes: 4403 not allowed (or no longer), 4410 the instance or its shell ended,
  4429 the user holds as many terminals and SSH sessions as one may (jobs/session_limits.py),
  4502 the engine could not start the shell.

An async consumer: nothing here waits on the server's loop. The exec's socket is read by a
thread of its own that sends one chunk at a time and waits until it is handed to the
connection before reading the next (so at most one chunk waits here; a slow browser slows the
shell, through the TTY's own buffers). Writes, resizes and the database run in executor
threads. Every ~2 s a check ends the terminal when the instance's run is no longer RUNNING or
the user may no longer see the job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model

from . import events, session_limits
from .access import may_see_job, visible_job
from .models import EventKind, TaskRun
from .runtime import engine, engine_exec

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403
CLOSE_ENDED = 4410
CLOSE_TOO_MANY = 4429
CLOSE_UNAVAILABLE = 4502
CHECK_S = 2.0  # how often the run's state and the user's access are read again
SEND_WAIT_S = 30.0  # a chunk the connection does not take within this long ends the terminal
MAX_INPUT_BYTES = 64 * 1024  # one frame of keystrokes or paste
MAX_SIZE = 1000  # rows and columns a resize may ask for


def running_task_run(user, job_id, index: int) -> TaskRun | None:
    """The instance's run of the job's newest attempt, if the user may see the job and it runs."""
    job = visible_job(user, id=job_id)
    if job is None:
        return None
    run = (
        TaskRun.objects.filter(attempt__job=job, index=index)
        .select_related("attempt__job", "host")
        .order_by("-attempt__number")
        .first()
    )
    if run is None or run.state != TaskRun.State.RUNNING or not (run.container_id or run.container_name):
        return None
    return run


def _connect_check(user, job_id, index: int) -> tuple[TaskRun | None, str]:
    """The running run, or None and what the user may be told: that the instance does not run
    when they may see the job, nothing when they may not (no hint that the job exists)."""
    run = running_task_run(user, job_id, index)
    if run is None and may_see_job(user, job_id):
        return None, "the instance is not running"
    return run, ""


def _still_open(user_id, job_id, run_id) -> int | None:
    """None while the terminal may stay open; else the close code."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None or not may_see_job(user, job_id):
        return CLOSE_FORBIDDEN
    if not TaskRun.objects.filter(id=run_id, state=TaskRun.State.RUNNING).exists():
        return CLOSE_ENDED
    return None


def run_container(run: TaskRun):
    """The engine's handle of a running run's container (by id once started, else by name)."""
    return engine.container(run.host, run.container_id or run.container_name)


def open_relay(run: TaskRun, port: int) -> engine_exec.Relay:
    """A byte relay to `port` inside the run's container: the app proxy's and the SSH relay's."""
    return engine_exec.open_relay(run_container(run), port)


def _open(run: TaskRun, rows: int, cols: int) -> engine_exec.ExecSession:
    return engine_exec.open_terminal(run_container(run), rows=rows, cols=cols)


def _record_opened(run: TaskRun, user) -> None:
    job = run.attempt.job
    events.record(
        job,
        EventKind.TERMINAL_OPENED,
        f"{user.get_username()} opened a terminal on {run.task_name} (attempt {run.attempt.number}).",
        user=user.get_username(),
        user_id=user.pk,
        instance=run.index,
        attempt=run.attempt.number,
        container=run.container_id[:12],
    )


def too_many_sessions() -> str:
    return (
        f"you have {session_limits.limit()} terminals and SSH sessions open, as many as one may; "
        "close one and try again"
    )


def _size(value) -> tuple[int, int] | None:
    """(rows, cols) from a resize's `[rows, cols]`, or None if it is not one."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE for v in value):
        return None
    return value[0], value[1]


class TerminalConsumer(AsyncWebsocketConsumer):
    """One shell per socket, as uid 1000 in the instance's container (jobs.runtime.engine_exec)."""

    session: engine_exec.ExecSession | None = None
    ending = False
    holds_session = False  # counted in session_limits: given back at disconnect

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        user = self.scope.get("user")
        run, why = None, ""
        if user is not None and user.is_authenticated:
            run, why = await database_sync_to_async(_connect_check)(user, kwargs["job_id"], kwargs["index"])
        # Accept, then close: a close before accept is a failed handshake (1006), which a
        # browser cannot tell from a network error; 4403 says "not for you" (or not now).
        await self.accept()
        if run is None:
            if why:
                await self.send(text_data=json.dumps({"ended": why, "code": CLOSE_FORBIDDEN}))
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.user_id, self.job_id, self.run_id = user.pk, run.attempt.job_id, run.id
        if not session_limits.take(self.user_id):
            await self.send(text_data=json.dumps({"ended": too_many_sessions(), "code": CLOSE_TOO_MANY}))
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.holds_session = True
        self.loop = asyncio.get_running_loop()
        try:
            self.session = await sync_to_async(_open, thread_sensitive=False)(run, 24, 80)
        except engine.HOST_ERRORS as exc:
            log.info("terminal on %s: %s", run.container_name, exc)
            ended = await database_sync_to_async(_still_open)(self.user_id, self.job_id, self.run_id)
            await self.end(ended or CLOSE_UNAVAILABLE, "the instance ended" if ended else f"no shell: {exc}"[:200])
            return
        await database_sync_to_async(_record_opened)(run, user)
        threading.Thread(target=self._pump, name=f"terminal-{run.container_name}", daemon=True).start()
        self.watcher = asyncio.create_task(self._watch())

    # -- the container's side ---------------------------------------------------------------------
    def _pump(self) -> None:
        """The reader thread: the TTY's bytes to the browser, one chunk at a time."""
        session = self.session
        while True:
            data = session.read()
            if not data:
                break
            try:
                asyncio.run_coroutine_threadsafe(self.send(bytes_data=data), self.loop).result(SEND_WAIT_S)
            except Exception:  # the page left, or does not take what it is sent
                break
        if not session.closed:
            asyncio.run_coroutine_threadsafe(self.end(CLOSE_ENDED, "the shell ended"), self.loop)

    async def _watch(self) -> None:
        while not self.ending:
            await asyncio.sleep(CHECK_S)
            code = await database_sync_to_async(_still_open)(self.user_id, self.job_id, self.run_id)
            if code == CLOSE_FORBIDDEN:
                await self.end(code, "no longer allowed")
            elif code == CLOSE_ENDED:
                await self.end(code, "the instance ended")

    async def end(self, code: int, why: str) -> None:
        """Say why, close the socket and hang up the shell (once)."""
        if self.ending:
            return
        self.ending = True
        try:
            await self.send(text_data=json.dumps({"ended": why, "code": code}))
            await self.close(code=code)
        finally:
            self._hang_up()

    def _hang_up(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            # Its own thread: a hang-up waits ~2 s in the container (engine_exec.HANG_UP).
            threading.Thread(target=session.close, name="terminal-hang-up", daemon=True).start()

    # -- the browser's side -----------------------------------------------------------------------
    async def receive(self, text_data=None, bytes_data=None) -> None:
        session = self.session
        if session is None or self.ending:
            return
        try:
            if bytes_data is not None:
                if len(bytes_data) <= MAX_INPUT_BYTES:  # a larger paste is dropped, not split
                    await sync_to_async(session.write, thread_sensitive=False)(bytes_data)
            elif text_data is not None:
                try:
                    control = json.loads(text_data)
                except ValueError:
                    return
                size = _size(control.get("resize")) if isinstance(control, dict) else None
                if size is not None:
                    await sync_to_async(session.resize, thread_sensitive=False)(*size)
        except engine.HOST_ERRORS as exc:
            log.info("terminal %s: %s", session.exec_id[:12], exc)
            await self.end(CLOSE_ENDED, "the shell ended")

    async def disconnect(self, code) -> None:
        self.ending = True
        if self.holds_session:
            self.holds_session = False
            session_limits.give_back(self.user_id)
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            watcher.cancel()
        self._hang_up()
