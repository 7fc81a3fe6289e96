"""The tests' synchronous websocket client: websockets' own, minus one way it loses messages.

Daphne (autobahn) ends every socket whose close it started with a TCP reset (SO_LINGER 0, seen
with strace). Under load the client's automatic reply to that close sometimes fails with
ECONNRESET (one connection in ~1500 with the CPUs busy, measured against a bare daphne), and
websockets' sync client then drops every frame of the read that brought the close ("if
self.send_data raised an exception, then events are lost"): the `{"ended": why}` text sent right
before a 4403 or 4410 close went missing in two full runs. Here the failed send is recorded as
the connection's error and the frames already read are still delivered, as a
browser delivers them."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as _connect


class FramesKeptConnection(ClientConnection):
    def send_data(self) -> None:
        try:
            super().send_data()
        except OSError as exc:  # the peer is gone; what it sent before going is still its message
            self.set_connection_exc(exc)


def connect(uri: str, **kwargs: Any) -> ClientConnection:
    return _connect(uri, create_connection=FramesKeptConnection, **kwargs)


# -- the console's sockets ---------------------------------------------------------------------
# The close code of a socket its user may not open (htmx's ws extension does not reconnect after
# it, as it does after 1006): a literal here, not the app's constant, so that changing the app's
# value fails the tests.
CLOSE_FORBIDDEN = 4403
HEADER_PHASE = re.compile(r'id="job-header".*?data-phase="([^"]+)"', re.S)
LOG_LINE = re.compile(r'<div class="ln" data-n="(\d+)">([^<]*)</div>')


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def ws_url(live_url: str, path: str) -> str:
    return live_url.replace("http://", "ws://", 1) + path


def open_socket(live_url: str, path: str, user=None) -> ClientConnection:
    """A socket of the console at `path`, signed in as `user` (none: anonymous), from its own origin."""
    headers = {"Origin": live_url}
    if user is not None:
        headers["Cookie"] = f"sessionid={session_cookie(user)}"
    return connect(ws_url(live_url, path), additional_headers=headers, open_timeout=10)


def refused(live_url: str, path: str, user=None):
    """Connect and read: returns how the server refused (close code, or the HTTP status of the handshake)."""
    try:
        ws = open_socket(live_url, path, user)
    except InvalidStatus as exc:
        return ("http", exc.response.status_code)
    with ws:
        try:
            message = ws.recv(timeout=10)
        except ConnectionClosed as exc:
            return ("close", exc.rcvd.code if exc.rcvd else None)
        raise AssertionError(f"a refused socket received data: {message[:200]!r}")


def closed_within(ws, timeout: float) -> int | None:
    """Read until the server closes the socket; its close code (AssertionError if it stays open)."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            ws.recv(timeout=remaining)
        except TimeoutError:
            break
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
    raise AssertionError(f"the socket stayed open {timeout}s")


def log_numbers(messages: list[str]) -> list[tuple[int, str]]:
    """(number, text) of every log line the log socket's messages carry, in order."""
    return [(int(n), text) for message in messages for n, text in LOG_LINE.findall(message)]


class Shell:
    """The browser's side of the framing: keystrokes as binary frames, control as JSON text."""

    def __init__(self, ws):
        self.ws, self.output, self.texts = ws, b"", []

    def type(self, text: str) -> None:
        self.ws.send(text.encode())

    def resize(self, rows: int, cols: int) -> None:
        self.ws.send(json.dumps({"resize": [rows, cols]}))

    def read_until(self, needle: bytes, timeout: float = 20) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {needle!r} in {self.output[-800:]!r}")
            try:
                message = self.ws.recv(timeout=remaining)
            except TimeoutError:
                continue
            if isinstance(message, bytes):
                self.output += message
            else:
                self.texts.append(json.loads(message))
        return self.output

    def closed_code(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                message = self.ws.recv(timeout=remaining)
            except TimeoutError:
                break
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None
            if isinstance(message, str):
                self.texts.append(json.loads(message))
        raise AssertionError(f"the terminal stayed open {timeout}s")
