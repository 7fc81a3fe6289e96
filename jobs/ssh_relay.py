"""SSH remote development through the console: `/ws/jobs/<job id>/ssh/<index>/` carries the raw
bytes of one SSH connection to the instance's own sshd (docs/decisions.md "SSH remote
development"). The user's ssh runs `console-ssh.py` (static/console/) as its ProxyCommand; the
SSH session itself (keys, host key check, encryption) is between the user's ssh and the
instance's sshd: the console only relays what it cannot read.

Who: a logged-in browser session or an API token (`Authorization: Token <key>`, what a script
has); the user must see the job, which must have asked for SSH remote development, and the
instance must run. Asked again every few seconds, as for the terminal: a user removed from the
workspace, deactivated or whose token was rotated is cut off.
Framing: binary frames both ways, the bytes as they are. Close codes: 4401 no credentials,
4403 not allowed (or no longer), 4410 the instance ended, 4429 the user holds as many terminals
and SSH sessions as one may (jobs/session_limits.py), 4502 the engine could not relay
(console-ssh.py says which).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

from . import session_limits
from .models import TaskRun
from .runtime import engine, engine_exec, ssh
from .terminal import (
    CLOSE_ENDED,
    CLOSE_FORBIDDEN,
    CLOSE_TOO_MANY,
    CLOSE_UNAVAILABLE,
    open_relay,
    running_task_run,
)

log = logging.getLogger(__name__)

CLOSE_NO_CREDENTIALS = 4401
CHECK_S = 5.0
MAX_FRAME_BYTES = 1024 * 1024


def _credentials(scope) -> tuple[object | None, str | None]:
    """(user, token key) from the session or the `Authorization: Token <key>` header, checked by
    DRF's own TokenAuthentication (an inactive user's token is refused); the key is kept to ask
    again later (a rotated token ends the connection)."""
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        return user, None
    header = dict((k.lower(), v) for k, v in scope.get("headers", [])).get(b"authorization", b"")
    kind, _, key = header.decode("latin-1").partition(" ")
    if kind.lower() != "token" or not key.strip():
        return None, None
    try:
        user, _token = TokenAuthentication().authenticate_credentials(key.strip())
    except AuthenticationFailed:
        return None, None
    return user, key.strip()


def _allowed_run(user, job_id, index: int) -> TaskRun | None:
    run = running_task_run(user, job_id, index)
    return run if run is not None and run.attempt.job.ssh_remote else None


def _still_open(user_id, token_key: str | None, job_id, index: int, run_id) -> int | None:
    """None while the connection may stay; else the close code."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None or (token_key and not Token.objects.filter(key=token_key, user_id=user_id).exists()):
        return CLOSE_FORBIDDEN
    if not TaskRun.objects.filter(id=run_id, state=TaskRun.State.RUNNING).exists():
        return CLOSE_ENDED
    return None if _allowed_run(user, job_id, index) is not None else CLOSE_FORBIDDEN


def _open(run: TaskRun) -> engine_exec.Relay:
    return open_relay(run, ssh.SSHD_PORT)


class SshRelayConsumer(AsyncWebsocketConsumer):
    relay: engine_exec.Relay | None = None
    holds_session = False  # counted in session_limits: given back at disconnect

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        self.job_id, self.index = kwargs["job_id"], kwargs["index"]
        self.user, self.token_key = await database_sync_to_async(_credentials)(self.scope)
        if self.user is None:
            await self.close(code=CLOSE_NO_CREDENTIALS)
            return
        run = await database_sync_to_async(_allowed_run)(self.user, self.job_id, self.index)
        if run is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.run_id = run.id
        if not session_limits.take(self.user.pk):
            await self.accept()  # then the close: its code reaches console-ssh.py, which says why
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.holds_session = True
        try:
            self.relay = await sync_to_async(_open, thread_sensitive=False)(run)
        except engine.HOST_ERRORS as exc:
            log.info("ssh relay %s/%s: %s", self.job_id, self.index, exc)
            await self.close(code=CLOSE_UNAVAILABLE)
            return
        await self.accept()
        self.loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, daemon=True, name="ssh-relay").start()
        self.watch = asyncio.ensure_future(self._watch())

    def _pump(self) -> None:
        """The sshd's bytes to the socket, one chunk at a time (the connection's pace)."""
        while data := self.relay.read():
            future = asyncio.run_coroutine_threadsafe(self.send(bytes_data=data), self.loop)
            try:
                future.result(timeout=30)
            except Exception:
                break
        asyncio.run_coroutine_threadsafe(self.close(code=1000), self.loop)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            code = await database_sync_to_async(_still_open)(
                self.user.pk, self.token_key, self.job_id, self.index, self.run_id
            )
            if code is not None:
                await self.close(code=code)
                return

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if bytes_data is None or self.relay is None or len(bytes_data) > MAX_FRAME_BYTES:
            return
        try:
            await sync_to_async(self.relay.write, thread_sensitive=False)(bytes_data)
        except engine.HOST_ERRORS:
            await self.close(code=CLOSE_ENDED)

    async def disconnect(self, code) -> None:
        if self.holds_session:
            self.holds_session = False
            session_limits.give_back(self.user.pk)
        if getattr(self, "watch", None) is not None:
            self.watch.cancel()
        if self.relay is not None:
            await sync_to_async(self.relay.close, thread_sensitive=False)()
