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

from typing import Any

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
