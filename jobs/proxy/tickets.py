"""The hand-over from the console's origin to an app's, and the app origin's own cookie.

Both are signed (django.core.signing, the console's secret key) and name the app origin they
are for: a ticket or cookie of one instance's JupyterLab opens nothing else. Both carry the
console session they came from: logging out of the console (or the session expiring) ends the
app's access at its next request. The cookie is HttpOnly and host-only on the app origin, and
never forwarded to the app (asgi.py strips it), so neither the job nor its JavaScript reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core import signing

from .origins import Target

COOKIE = "console_app"
TICKET_MAX_AGE_S = 60
COOKIE_MAX_AGE_S = 8 * 3600
_TICKET_SALT = "jobs.proxy.ticket"
_COOKIE_SALT = "jobs.proxy.cookie"


@dataclass(frozen=True)
class Grant:
    user_id: int
    session_key: str


def _dumps(grant: Grant, target: Target, salt: str) -> str:
    return signing.dumps({"u": grant.user_id, "s": grant.session_key, "l": target.label}, salt=salt)


def _loads(value: str, target: Target, salt: str, max_age: int) -> Grant | None:
    try:
        data = signing.loads(value, salt=salt, max_age=max_age)
    except (signing.BadSignature, TypeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("l") != target.label:
        return None
    if not isinstance(data.get("u"), int) or not isinstance(data.get("s"), str):
        return None
    return Grant(data["u"], data["s"])


def ticket(grant: Grant, target: Target) -> str:
    return _dumps(grant, target, _TICKET_SALT)


def from_ticket(value: str, target: Target) -> Grant | None:
    return _loads(value, target, _TICKET_SALT, TICKET_MAX_AGE_S)


def cookie(grant: Grant, target: Target) -> str:
    return _dumps(grant, target, _COOKIE_SALT)


def from_cookie(value: str, target: Target) -> Grant | None:
    return _loads(value, target, _COOKIE_SALT, COOKIE_MAX_AGE_S)
