"""JupyterLab and TensorBoard through the console (jobs/proxy/), with a hostile "app": the job
itself serves port 8888 (busybox httpd and a CGI that prints what it was sent, or a websocket
echo in Python), so the test sees exactly what the console forwards and what it passes back.

- The hand-over: the job page's link gives a one-minute ticket for that instance's origin only;
  the origin's own cookie then reaches the app; without it, with another instance's, after the
  console session ended, or for a user who may not see the job: refused.
- The job never sees the console's cookies (session, CSRF, the app cookie); a Set-Cookie of the
  app loses its Domain (so it cannot reach the console's origin) and may not overwrite the
  console's cookie.
- Websockets (JupyterLab's kernels) are relayed both ways.
"""

from __future__ import annotations

import asyncio
import base64
import re
import socket
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import websockets
from django.contrib.sessions.models import Session
from django.test import Client

from jobs.models import TaskRun
from jobs.proxy import tickets
from jobs.proxy.http import forwarded_cookie, set_cookie_for_browser
from jobs.proxy.origins import APPS, Target, origin, target_of
from tests.helpers import PYTHON_IMAGE, log_texts, running_instance, submit_job, wait_for

CGI = r"""#!/bin/sh
printf 'Content-Type: text/plain\r\n'
printf 'Set-Cookie: theirs=1; Domain=localhost; Path=/\r\n'
printf 'Set-Cookie: console_app=forged; Path=/\r\n'
printf 'Set-Cookie: sessionid=forged; Domain=.localhost; Path=/\r\n\r\n'
echo "cookie=$HTTP_COOKIE"
echo "host=$HTTP_HOST"
echo "method=$REQUEST_METHOD"
echo "forwarded=$HTTP_X_FORWARDED_FOR"
"""
HTTPD = (
    "mkdir -p /tmp/www/cgi-bin && cat > /tmp/www/cgi-bin/echo <<'EOF'\n" + CGI + "EOF\n"
    "chmod +x /tmp/www/cgi-bin/echo && echo hello-from-the-app > /tmp/www/index.html && "
    "echo serving && exec httpd -f -p 127.0.0.1:8888 -h /tmp/www"
)
WS_ECHO = r"""
import base64, hashlib, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8888)); s.listen(8); print("serving", flush=True)
while True:
    c, _ = s.accept(); f = c.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"): head += f.read(1)
    key = re.search(rb"(?i)sec-websocket-key: *(\S+)", head).group(1)
    cookie = (re.search(rb"(?i)\r\ncookie: *([^\r]*)", head) or [b"", b""])[1]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    def frame(text): data = text.encode(); return bytes([0x81, len(data)]) + data
    c.sendall(frame("cookie=" + cookie.decode()))
    while True:
        b1, b2 = f.read(2)
        n = b2 & 127
        mask = f.read(4); data = bytes(x ^ mask[i % 4] for i, x in enumerate(f.read(n)))
        if b1 & 15 == 8: break
        c.sendall(frame("echo:" + data.decode()))
    c.close()
""".replace("import base64", "import re, base64")


# -- pure parts --------------------------------------------------------------------------------------------------
def test_app_hosts_are_told_apart_from_the_console(settings):
    settings.APPS_DOMAIN = "localhost"
    job = "0123456789abcdef0123456789abcdef"
    target = target_of(f"lab-{job}-1.localhost:8000")
    assert target is not None and (target.app.key, target.job_id.hex, target.index) == ("lab", job, 1)
    for host in ("127.0.0.1:8000", "localhost", f"lab-{job}-1.localhost.evil.example", f"xx-{job}-1.localhost"):
        assert target_of(host) is None, host
    assert origin(target, scheme="https", console_host="console.example:8443") == (
        f"https://lab-{job}-1.localhost:8443"
    )


def test_the_console_cookies_never_reach_the_app_and_its_cookies_stay_on_its_origin(settings):
    assert forwarded_cookie("sessionid=abc; mine=1; csrftoken=x; console_app=y; theirs=2") == "mine=1; theirs=2"
    assert set_cookie_for_browser(b"a=1; Domain=.localhost; Path=/; HttpOnly") == b"a=1; Path=/; HttpOnly"
    assert set_cookie_for_browser(b"sessionid=forged; Path=/") is None
    assert set_cookie_for_browser(b"console_app=forged") is None


def test_a_ticket_opens_only_the_origin_it_names():
    job = "0123456789abcdef0123456789abcdef"
    mine, other = target_of(f"lab-{job}-0.localhost"), target_of(f"lab-{job}-1.localhost")
    value = tickets.ticket(tickets.Grant(7, "the-session-key"), mine)
    assert tickets.from_ticket(value, mine) == tickets.Grant(7, "the-session-key")
    # It travels in a URL (history, access logs): the session key is not readable in it.
    assert b"the-session-key" not in base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    assert tickets.from_ticket(value[:-2] + ("A" if value[-2] != "A" else "B") + value[-1], mine) is None
    assert tickets.from_ticket(value, other) is None
    assert tickets.from_cookie(value, mine) is None  # a ticket is not a cookie (another key)


# -- a real job serving port 8888 -----------------------------------------------------------------------------
def logged_in(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


class AppClient:
    """Requests to an app origin of the live console (the Host header names the origin)."""

    def __init__(self, live_url: str, host: str):
        self.base, self.host = live_url, host
        self.cookies: dict[str, str] = {}

    def get(self, path: str, **kwargs) -> requests.Response:
        cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        headers = {"Host": self.host, **({"Cookie": cookie} if cookie else {}), **kwargs.pop("headers", {})}
        return requests.get(self.base + path, headers=headers, allow_redirects=False, timeout=30, **kwargs)


def open_app(live_url: str, session: str, job, app: str = "lab", index: int = 0) -> tuple[AppClient, requests.Response]:
    """Click "Open JupyterLab" as the session's user; follow the hand-over to the app origin."""
    answer = requests.get(
        f"{live_url}/jobs/{job.id}/apps/{app}/{index}/",
        cookies={"sessionid": session},
        allow_redirects=False,
        timeout=30,
    )
    if answer.status_code != 302:
        return None, answer
    location = urlsplit(answer.headers["Location"])
    client = AppClient(live_url, location.netloc)
    landed = client.get(f"{location.path}?{location.query}")
    if found := re.search(r"console_app=([^;]+)", landed.headers.get("Set-Cookie", "")):
        client.cookies["console_app"] = found.group(1)
    return client, landed


@pytest.fixture
def app_job(demo, worker, live_url):
    job = submit_job(demo, name="app", command=HTTPD, jupyter_lab=True)
    run = running_instance(job)
    wait_for(lambda: "serving" in _log(run), timeout=30, message="the app to serve")
    return job


def _log(run: TaskRun) -> str:
    return "\n".join(log_texts(run))


def test_the_hand_over_then_the_app_through_the_console(demo, app_job, live_url):
    session = logged_in(demo.owner)
    client, landed = open_app(live_url, session, app_job)
    assert landed.status_code == 303 and landed.headers["Location"] == "/lab"
    assert "HttpOnly" in landed.headers["Set-Cookie"] and "Domain" not in landed.headers["Set-Cookie"]
    page = client.get("/index.html")
    assert page.status_code == 200 and page.text == "hello-from-the-app\n"

    # The hostile app: what it received, what it tried to set.
    client.cookies |= {"sessionid": session, "csrftoken": "console-csrf", "mine": "1"}
    echoed = client.get("/cgi-bin/echo", headers={"X-Forwarded-For": "6.6.6.6"})
    assert echoed.status_code == 200, echoed.text
    lines = dict(line.split("=", 1) for line in echoed.text.splitlines())
    assert lines["cookie"] == "mine=1"  # no session, no CSRF token, no app cookie
    assert lines["host"] == "127.0.0.1:8888" and lines["method"] == "GET" and lines["forwarded"] == ""
    set_cookies = echoed.raw.headers.getlist("Set-Cookie")
    assert set_cookies == ["theirs=1; Path=/"]  # no Domain; the console's names dropped


def test_refused_without_the_cookie_for_another_instance_and_after_logout(demo, app_job, live_url):
    session = logged_in(demo.owner)
    client, _ = open_app(live_url, session, app_job)
    stranger = AppClient(live_url, client.host)
    assert stranger.get("/index.html").status_code == 403
    # The cookie of instance 0 on instance 1's origin (and a ticket replayed there): refused.
    other = AppClient(live_url, client.host.replace("-0.", "-1.", 1))
    other.cookies = dict(client.cookies)
    assert other.get("/index.html").status_code == 403
    assert client.get("/index.html").status_code == 200
    Session.objects.filter(session_key=session).delete()  # logged out of the console
    assert client.get("/index.html").status_code == 403


def test_a_user_who_may_not_see_the_job_gets_no_ticket(demo, app_job, live_url):
    client, answer = open_app(live_url, logged_in(demo.outsider), app_job)
    assert client is None and answer.status_code == 404
    # A ticket made for the owner does not work with the outsider's session either.
    target = Target(APPS["lab"], app_job.id, 0)
    forged = tickets.ticket(tickets.Grant(demo.outsider.pk, logged_in(demo.outsider)), target)
    host = urlsplit(origin(target, scheme="http", console_host=urlsplit(live_url).netloc)).netloc
    landed = AppClient(live_url, host).get(f"/.console/login?ticket={forged}")
    assert landed.status_code == 403


def test_an_app_the_job_did_not_ask_for_is_not_served(demo, app_job, live_url):
    client, answer = open_app(live_url, logged_in(demo.owner), app_job, app="tb")
    assert client is None and answer.status_code == 404


def test_websockets_are_relayed_both_ways(demo, worker, live_url):
    job = submit_job(demo, name="ws", image=PYTHON_IMAGE, command=f"python3 -c '{WS_ECHO}'", jupyter_lab=True)
    run = running_instance(job)
    wait_for(lambda: "serving" in _log(run), timeout=30, message="the echo server")
    client, _ = open_app(live_url, logged_in(demo.owner), job)
    port = urlsplit(live_url).port

    async def talk() -> list[str]:
        headers = {"Cookie": f"console_app={client.cookies['console_app']}; mine=2"}
        # The app's host name in the URL (so in Host), the console's loopback port as the socket.
        async with websockets.connect(
            f"ws://{client.host}/api/kernels/x/channels",
            additional_headers=headers,
            origin=f"http://{client.host}",
            sock=socket.create_connection(("127.0.0.1", port)),
        ) as ws:
            got = [await ws.recv()]
            await ws.send("ping-1")
            got.append(await ws.recv())
            return got

    assert asyncio.run(talk()) == ["cookie=mine=2", "echo:ping-1"]


def test_the_job_page_links_each_running_instance(demo, app_job):
    client = Client()
    client.force_login(demo.owner)
    page = client.get(f"/jobs/{app_job.id}/?tab=attempts").content.decode()
    assert f"/jobs/{app_job.id}/apps/lab/0/" in page and "Open JupyterLab" in page
    assert "Open TensorBoard" not in page
    query = parse_qs("")
    assert query == {}
