"""A websocket of the app (JupyterLab's kernels and terminals), relayed frame by frame.

The browser's socket is daphne's; the app's is spoken with websockets' sans-I/O client over the
relay's bytes. Access is asked again every few seconds, as for the console's own sockets: a user
removed from the workspace, logged out or deactivated, or an instance that ended, closes it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from jobs.runtime import engine
from jobs.terminal import open_relay

from . import access
from .asgi import checked, header
from .http import forwarded_cookie, in_thread, slots
from .origins import Target

log = logging.getLogger(__name__)

RECHECK_S = 5.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CLOSE_FORBIDDEN, CLOSE_UNAVAILABLE = 4403, 4502


async def relay(scope: dict, receive, send, target: Target) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    run, grant, _why = await checked(scope, target)
    if run is None:
        await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN})
        return
    async with slots():
        try:
            connection = await in_thread(open_relay, run, target.app.port)
        except engine.HOST_ERRORS:
            await send({"type": "websocket.close", "code": CLOSE_UNAVAILABLE})
            return
        try:
            await _session(scope, receive, send, target, connection, grant)
        finally:
            await in_thread(connection.close)


def _handshake(scope: dict, target: Target) -> ClientProtocol:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    uri = f"ws://127.0.0.1:{target.app.port}{path.decode('latin-1')}" + (f"?{query.decode('latin-1')}" if query else "")
    protocols = [p for p in scope.get("subprotocols") or []]
    return ClientProtocol(parse_uri(uri), subprotocols=protocols or None, max_size=MAX_MESSAGE_BYTES)


async def _session(scope, receive, send, target: Target, connection, grant) -> None:
    protocol = _handshake(scope, target)
    request = protocol.connect()
    if cookie := forwarded_cookie(header(scope, b"cookie")):
        request.headers["Cookie"] = cookie
    protocol.send_request(request)
    await in_thread(connection.write, b"".join(protocol.data_to_send()))
    accepted = False
    closed = asyncio.Event()
    fragments: list[bytes] = []
    fragment_opcode: Opcode | None = None

    async def from_app() -> None:
        nonlocal accepted, fragment_opcode
        while not closed.is_set():
            data = await in_thread(connection.read)
            if data:
                protocol.receive_data(data)
            else:
                protocol.receive_eof()
            for event in protocol.events_received():
                if isinstance(event, Response):
                    if event.status_code != 101 or protocol.handshake_exc is not None:
                        await send({"type": "websocket.close", "code": CLOSE_UNAVAILABLE})
                        closed.set()
                        return
                    accepted = True
                    await send({"type": "websocket.accept", "subprotocol": event.headers.get("Sec-WebSocket-Protocol")})
                elif isinstance(event, Frame):
                    await _frame_to_browser(event)
            if pending := protocol.data_to_send():  # pongs, a close's answer
                await in_thread(connection.write, b"".join(pending))
            if not data:
                break
        closed.set()
        await send({"type": "websocket.close", "code": 1000})

    async def _frame_to_browser(frame: Frame) -> None:
        nonlocal fragment_opcode
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
            fragment_opcode, fragments[:] = frame.opcode, [frame.data]
        elif frame.opcode == Opcode.CONT:
            fragments.append(frame.data)
        elif frame.opcode == Opcode.CLOSE:
            closed.set()
            return
        else:
            return  # ping/pong: the protocol answers pings itself
        if frame.fin and fragment_opcode is not None:
            data = b"".join(fragments)
            fragments.clear()
            if fragment_opcode == Opcode.TEXT:
                await send({"type": "websocket.send", "text": data.decode("utf-8", errors="replace")})
            else:
                await send({"type": "websocket.send", "bytes": data})
            fragment_opcode = None

    async def from_browser() -> None:
        while not closed.is_set():
            message = await receive()
            if message["type"] == "websocket.disconnect":
                break
            if message["type"] != "websocket.receive" or not accepted:
                continue
            if message.get("text") is not None:
                protocol.send_text(message["text"].encode())
            elif message.get("bytes") is not None:
                protocol.send_binary(message["bytes"])
            await in_thread(connection.write, b"".join(protocol.data_to_send()))
        closed.set()

    async def recheck() -> None:
        last = time.monotonic()
        while not closed.is_set():
            await asyncio.sleep(0.5)
            if time.monotonic() - last < RECHECK_S:
                continue
            last = time.monotonic()
            run, _why = await database_sync_to_async(access.allowed_run)(grant, target)
            if run is None:
                closed.set()
                await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN})

    tasks = [asyncio.ensure_future(t()) for t in (from_app, from_browser, recheck)]
    try:
        await closed.wait()
    finally:
        for task in tasks:
            task.cancel()
        await in_thread(connection.close)
        await asyncio.gather(*tasks, return_exceptions=True)
