"""The hand-over from the console's origin to an app's, and the app origin's own cookie.

Both name the app origin they are for (a ticket or cookie of one instance's JupyterLab opens
nothing else) and carry the console session they came from: logging out of the console (or the
session expiring) ends the app's access at its next request. Both are encrypted and
authenticated (AES-GCM, a key derived from the console's secret key, the origin as associated
data), not only signed: the ticket travels in a URL (browser history, access logs) and the
session key in it must not be readable there. The cookie is HttpOnly and host-only on the app
origin, and never forwarded to the app (jobs/proxy/http.py strips it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

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


def _key(salt: str) -> bytes:
    return hashlib.sha256(f"{salt}:{settings.SECRET_KEY}".encode()).digest()


def _dumps(grant: Grant, target: Target, salt: str) -> str:
    data = json.dumps({"u": grant.user_id, "s": grant.session_key, "t": int(time.time())}).encode()
    nonce = os.urandom(12)
    sealed = AESGCM(_key(salt)).encrypt(nonce, data, target.label.encode())
    return base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")


def _loads(value: str, target: Target, salt: str, max_age: int) -> Grant | None:
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        data = json.loads(AESGCM(_key(salt)).decrypt(raw[:12], raw[12:], target.label.encode()))
    except (InvalidTag, ValueError, binascii.Error, TypeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("t"), int):
        return None
    if not isinstance(data.get("u"), int) or not isinstance(data.get("s"), str):
        return None
    if not -30 <= time.time() - data["t"] <= max_age:  # -30: another console machine's clock a little ahead
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
