"""The ASGI entry of the app origins: who the request is for, the hand-over, the checks.

Nothing of Django's request handling runs here (its middleware, CSRF and sessions belong to the
console's origin); the database is asked through `database_sync_to_async`.
"""

from __future__ import annotations

import html
import logging
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from . import access, tickets
from .origins import Target, target_of

log = logging.getLogger(__name__)

LOGIN_PATH = "/.console/login"


def header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def is_app_host(scope: dict) -> bool:
    return scope.get("type") in ("http", "websocket") and target_of(header(scope, b"host")) is not None


def cookies_of(scope: dict) -> dict[str, str]:
    jar = SimpleCookie()
    try:
        jar.load(header(scope, b"cookie"))
    except CookieError:
        return {}
    return {k: m.value for k, m in jar.items()}


async def page(send, status: int, title: str, text: str, extra_headers: list | None = None) -> None:
    body = (
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
        "<body style='font:14px system-ui;margin:48px auto;max-width:640px'>"
        f"<h1 style='font-size:20px'>{html.escape(title)}</h1><p>{html.escape(text)}</p>"
    )
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"cache-control", b"no-store"),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


async def _login(scope: dict, send, target: Target) -> None:
    """The hand-over: a valid ticket becomes this origin's cookie, then the app's first page."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    grant = tickets.from_ticket((query.get("ticket") or [""])[0], target)
    if grant is None:
        await page(send, 403, "Link expired", "Open the app again from the job's page in the console.")
        return
    run, why = await database_sync_to_async(access.allowed_run)(grant, target)
    if run is None:
        await page(send, 403, f"{target.app.name} is not available", why)
        return
    next_path = (query.get("next") or ["/"])[0]
    if not next_path.startswith("/") or next_path.startswith("//"):
        next_path = "/"
    secure = "; Secure" if scope.get("scheme") in ("https", "wss") else ""
    value = tickets.cookie(grant, target)
    set_cookie = f"{tickets.COOKIE}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={tickets.COOKIE_MAX_AGE_S}{secure}"
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [
                (b"location", next_path.encode("latin-1", "replace")),
                (b"set-cookie", set_cookie.encode("latin-1")),
                (b"cache-control", b"no-store"),
                (b"referrer-policy", b"no-referrer"),  # the ticket never leaves in a Referer
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def checked(scope: dict, target: Target):
    """(run, grant, why): the instance's run when this request's cookie may reach the app."""
    grant = tickets.from_cookie(cookies_of(scope).get(tickets.COOKIE, ""), target)
    if grant is None:
        return None, None, "Open the app from the job's page in the console (the link signs you in)."
    run, why = await database_sync_to_async(access.allowed_run)(grant, target)
    return run, grant, why


async def application(scope: dict, receive, send) -> None:
    from . import http, websocket  # the relays import the runtime: loaded on first use

    target = target_of(header(scope, b"host"))
    if target is None:  # pragma: no cover - console/asgi.py routes only app hosts here
        raise ValueError("not an app origin")
    if scope["type"] == "http":
        if scope["path"] == LOGIN_PATH:
            await _login(scope, send, target)
            return
        run, _grant, why = await checked(scope, target)
        if run is None:
            await page(send, 403, f"{target.app.name} is not available", why)
            return
        await http.relay(scope, receive, send, target, run)
    elif scope["type"] == "websocket":
        await websocket.relay(scope, receive, send, target)
