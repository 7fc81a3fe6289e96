"""Webhooks are safe by default (jobs/outbound.py), written as the attacks a user's webhook URL
makes: the console's own loopback services, a cloud's metadata address, private ranges, a name
that resolves to loopback, a redirect to an internal address, an endless response. Real
sockets: a receiver on 127.0.0.1 counts what reaches it."""

from __future__ import annotations

import ipaddress
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings

from jobs import outbound


class Server:
    """An HTTP server on 127.0.0.1 that counts requests and answers as `answer` says."""

    def __init__(self, answer):
        self.hits: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.hits.append(self.path)
                answer(self)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, host: str = "127.0.0.1", path: str = "/hook") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ok(handler) -> None:
    handler.send_response(200)
    handler.end_headers()
    handler.wfile.write(b"fine")


@pytest.fixture
def server():
    made = []

    def make(answer=ok) -> Server:
        made.append(Server(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


def post(url: str) -> outbound.Response:
    return outbound.post(url, b"{}", {"Content-Type": "application/json"}, timeout_s=2)


@pytest.mark.parametrize(
    "address, reason",
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.0.0.5", "private"),
        ("192.168.1.1", "private"),
        ("172.17.0.1", "private"),  # Docker's bridge: the host seen from a container
        ("100.64.0.1", "not public"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
    ],
)
@override_settings(OUTBOUND_ALLOW=[])
def test_non_public_addresses_are_refused(address, reason):
    assert outbound.why_refused(ipaddress.ip_address(address)) == reason


@override_settings(OUTBOUND_ALLOW=[])
def test_public_addresses_are_allowed():
    for address in ("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "8.8.8.8"):
        assert outbound.why_refused(ipaddress.ip_address(address)) is None


@override_settings(OUTBOUND_ALLOW=[])
def test_the_consoles_own_loopback_receives_nothing(server):
    """The console's PostgreSQL, Redis and daphne listen there: a webhook never reaches it, by
    address or by a name that resolves to it."""
    target = server()
    for url in (target.url(), target.url("localhost"), target.url("[::ffff:127.0.0.1]")):
        with pytest.raises(outbound.OutboundRefused) as refused:
            post(url)
        assert "loopback" in str(refused.value) and "CONSOLE_OUTBOUND_ALLOW" in str(refused.value)
    time.sleep(0.2)
    assert target.hits == []


def test_an_allowed_network_is_posted_to(server):
    target = server()
    with override_settings(OUTBOUND_ALLOW=["127.0.0.1/32"]):
        response = post(target.url(path="/hook?x=1"))
    assert (response.status, response.text) == (200, "fine")
    assert target.hits == ["/hook?x=1"]


def test_a_redirect_is_not_followed(server):
    inside = server()

    def redirect(handler) -> None:
        handler.send_response(302)
        handler.send_header("Location", inside.url(path="/internal"))
        handler.end_headers()

    gateway = server(redirect)
    with override_settings(OUTBOUND_ALLOW=["127.0.0.1/32"]):
        response = post(gateway.url())
    assert response.status == 302
    time.sleep(0.2)
    assert inside.hits == []


def test_an_endless_response_is_read_up_to_the_cap(server):
    def endless(handler) -> None:
        handler.send_response(200)
        handler.end_headers()
        chunk = b"x" * 65536
        try:
            for _ in range(1000):  # 64 MB if anyone read it all
                handler.wfile.write(chunk)
        except OSError:
            pass  # the console hung up

    target = server(endless)
    with override_settings(OUTBOUND_ALLOW=["127.0.0.1/32"]):
        response = post(target.url())
    assert response.status == 200 and len(response.text) == outbound.MAX_RESPONSE_BYTES


def test_urls_that_are_not_plain_http_are_refused():
    for url in ("file:///etc/passwd", "gopher://127.0.0.1:6379/_INFO", "http://user:pw@example.com/", "http:///x"):
        with pytest.raises(outbound.OutboundRefused):
            post(url)
