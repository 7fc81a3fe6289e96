"""Requests the console makes to addresses its users chose (job webhooks): safe by default.

A webhook URL is the user's, the worker that posts to it is the console's: without care the
worker is a proxy to whatever its hosts can reach (a Docker TCP API, the console's PostgreSQL,
Redis and daphne, a cloud's metadata service). So, for every request:

- the host name is resolved once, here, and every address it resolves to must be public: no
  loopback, private, link-local (169.254.169.254), shared, multicast, reserved or unspecified
  address, IPv4-mapped or not, unless an operator allows its network (settings.OUTBOUND_ALLOW,
  `CONSOLE_OUTBOUND_ALLOW`, e.g. an internal chat gateway);
- the connection goes to that checked address (the name is only sent as Host and TLS server
  name), so a second resolution cannot swap in another one (DNS rebinding);
- redirects are not followed, and the time (connect, each read, the whole response) and the
  size read of the response are bounded.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import certifi
import urllib3
from django.conf import settings

MAX_RESPONSE_BYTES = 64 * 1024

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class OutboundRefused(Exception):
    """The console will not send to this address (the message says why); retrying is pointless."""


class OutboundFailed(Exception):
    """The request was made and failed (connection, timeout, TLS): worth retrying."""


@dataclass(frozen=True)
class Response:
    status: int
    text: str  # at most MAX_RESPONSE_BYTES of the body, decoded leniently


def allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(net, strict=False) for net in settings.OUTBOUND_ALLOW]


def why_refused(address: IPAddress) -> str | None:
    """Why the console does not send to this address, or None when it may."""
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    if any(address in net for net in allowed_networks() if net.version == address.version):
        return None
    for attribute, name in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(address, attribute):
            return name
    if not address.is_global:
        return "not public"
    return None


def _resolve(host: str, port: int) -> IPAddress:
    """The address to connect to: every address of the name must be allowed (a name that
    resolves to a public and a private address is refused, not tried on the public one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OutboundFailed(f"cannot resolve {host}: {exc}") from exc
    addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    for address in addresses:
        reason = why_refused(address)
        if reason:
            raise OutboundRefused(
                f"{host} is {address}, a {reason} address: the console does not send there "
                "(an operator can allow its network with CONSOLE_OUTBOUND_ALLOW)."
            )
    return addresses[0]


def post(url: str, body: bytes, headers: dict[str, str], *, timeout_s: float) -> Response:
    """POST `body` to `url` under the rules above. Raises OutboundRefused or OutboundFailed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused(f"only http and https URLs are sent to, not '{url[:100]}'.")
    if parts.username or parts.password:
        raise OutboundRefused("a URL with a user name or password is not sent to.")
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    address = _resolve(parts.hostname, port)
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
    pool_kwargs: dict = {"timeout": timeout, "retries": False, "maxsize": 1}
    if https:
        pool = urllib3.HTTPSConnectionPool(
            str(address),
            port,
            cert_reqs="CERT_REQUIRED",
            ca_certs=certifi.where(),
            server_hostname=parts.hostname,
            assert_hostname=parts.hostname,
            **pool_kwargs,
        )
    else:
        pool = urllib3.HTTPConnectionPool(str(address), port, **pool_kwargs)
    host_header = parts.netloc.rsplit("@", 1)[-1]
    deadline = time.monotonic() + 2 * timeout_s
    try:
        with pool:
            response = pool.urlopen(
                "POST",
                target,
                body=body,
                headers={**headers, "Host": host_header},
                redirect=False,
                preload_content=False,
                assert_same_host=False,
            )
            data = bytearray()
            try:
                while len(data) < MAX_RESPONSE_BYTES and time.monotonic() < deadline:
                    chunk = response.read(min(8192, MAX_RESPONSE_BYTES - len(data)))
                    if not chunk:
                        break
                    data.extend(chunk)
            finally:
                response.release_conn()
                response.close()
    except urllib3.exceptions.HTTPError as exc:
        raise OutboundFailed(f"{type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise OutboundFailed(f"{type(exc).__name__}: {exc}") from exc
    return Response(response.status, bytes(data).decode("utf-8", errors="replace"))
