"""An HTTP request to the app on the instance's loopback, and its answer back, streamed.

One relay (one exec of the console's nc) per request, with `Connection: close`: the app's answer
ends when the connection does, so nothing is parsed twice and nothing is pooled across users.
h11 speaks HTTP/1.1 to the app; the browser's side is daphne's.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import h11
from django.conf import settings

from jobs.models import TaskRun
from jobs.runtime import engine, engine_exec
from jobs.terminal import open_relay

from . import tickets
from .asgi import page
from .origins import Target

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # an upload into JupyterLab; more is refused (413)
MAX_RELAYS = 64  # open relays per process: each holds a thread while it reads
FIRST_BYTE_TIMEOUT_S = 60
HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
    b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
}  # fmt: skip

_pool = ThreadPoolExecutor(max_workers=MAX_RELAYS + 8, thread_name_prefix="app-relay")
# Per event loop: a semaphore belongs to the loop it first waits on.
_slots_by_loop: dict[int, asyncio.Semaphore] = {}


def slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    return _slots_by_loop.setdefault(id(loop), asyncio.Semaphore(MAX_RELAYS))


async def in_thread(func, *args):
    return await asyncio.get_running_loop().run_in_executor(_pool, func, *args)


def console_cookie_names() -> set[str]:
    return {tickets.COOKIE, settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}


def forwarded_cookie(value: str) -> str:
    """The Cookie header without the console's own cookies (the app is the job's code)."""
    names = console_cookie_names()
    kept = [part.strip() for part in value.split(";") if part.strip().split("=", 1)[0].strip() not in names]
    return "; ".join(p for p in kept if p)


def request_headers(scope: dict, port: int, body_length: int) -> list[tuple[bytes, bytes]]:
    headers = [(b"host", f"127.0.0.1:{port}".encode())]
    for key, value in scope.get("headers", []):
        key = key.lower()
        if key in HOP_BY_HOP or key.startswith(b"x-forwarded-") or key == b"forwarded":
            continue
        if key == b"cookie":
            value = forwarded_cookie(value.decode("latin-1")).encode("latin-1")
            if not value:
                continue
        headers.append((key, value))
    headers.append((b"content-length", str(body_length).encode()))
    headers.append((b"connection", b"close"))
    return headers


def set_cookie_for_browser(value: bytes) -> bytes | None:
    """An app's Set-Cookie, host-only on its own origin: a Domain attribute would let the job set
    cookies for the console's origin (session fixation, CSRF cookie tossing). The console's own
    cookie names are dropped."""
    parts = [p.strip() for p in value.decode("latin-1").split(";")]
    if not parts or "=" not in parts[0]:
        return None
    if parts[0].split("=", 1)[0].strip() in console_cookie_names():
        return None
    kept = [parts[0]] + [p for p in parts[1:] if p and p.split("=", 1)[0].strip().lower() != "domain"]
    return "; ".join(kept).encode("latin-1")


def response_headers(headers) -> list[tuple[bytes, bytes]]:
    out = []
    for key, value in headers:
        key = key.lower()
        if key in HOP_BY_HOP - {b"content-length"}:
            continue
        if key == b"set-cookie":
            value = set_cookie_for_browser(value)
            if value is None:
                continue
        out.append((key, value))
    return out


async def read_body(receive) -> bytes | None:
    """The request's whole body; None when it is larger than MAX_BODY_BYTES."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def relay(scope: dict, receive, send, target: Target, run: TaskRun) -> None:
    body = await read_body(receive)
    if body is None:
        await page(send, 413, "Too large", f"At most {MAX_BODY_BYTES // 2**20} MB can be sent to {target.app.name}.")
        return
    async with slots():
        try:
            connection = await in_thread(open_relay, run, target.app.port)
        except engine.HOST_ERRORS as exc:
            await page(send, 502, f"{target.app.name} cannot be reached", f"The instance's engine: {exc}")
            return
        try:
            await _exchange(scope, send, target, connection, body)
        finally:
            await in_thread(connection.close)


async def _exchange(scope: dict, send, target: Target, connection: engine_exec.Relay, body: bytes) -> None:
    path = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        path += b"?" + scope["query_string"]
    client = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method=scope["method"], target=path, headers=request_headers(scope, target.app.port, len(body))
    )
    out = client.send(request) + (client.send(h11.Data(data=body)) if body else b"") + client.send(h11.EndOfMessage())
    try:
        await in_thread(connection.write, out)
    except engine.HOST_ERRORS as exc:
        await page(send, 502, f"{target.app.name} cannot be reached", str(exc))
        return
    started = False
    while True:
        try:
            event = client.next_event()
        except h11.RemoteProtocolError as exc:
            if not started:
                await page(send, 502, f"{target.app.name} answered something that is not HTTP", str(exc)[:200])
            break
        if event is h11.NEED_DATA:
            read = in_thread(connection.read)
            try:
                data = await (read if started else asyncio.wait_for(read, FIRST_BYTE_TIMEOUT_S))
            except TimeoutError:
                await page(send, 504, f"{target.app.name} is not answering", "No answer within a minute.")
                return
            client.receive_data(data)
            if not data and not started:
                why = connection.stderr.decode(errors="replace").strip() or "the connection closed"
                await page(
                    send,
                    502,
                    f"{target.app.name} does not answer",
                    f"Nothing answers on port {target.app.port} of instance {target.index} ({why}). It may still be "
                    f"starting, or the image has no {target.app.name}: see the instance's log.",
                )
                return
            continue
        if isinstance(event, h11.Response):
            started = True
            await send(
                {"type": "http.response.start", "status": event.status_code, "headers": response_headers(event.headers)}
            )
        elif isinstance(event, h11.Data):
            await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            break
        elif isinstance(event, h11.InformationalResponse):
            continue
    if started:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
