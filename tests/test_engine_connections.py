"""How many connections a thread's client keeps to its engine, whatever it calls.

The SDK's unix-socket transport kept a connection pool per request URL: every call to a new URL
(a container's path, another filter) opened a connection to the engine, and each client kept up
to 25 of them open, so a worker held some 850 while idle (bench/worker_soak.py). A real engine,
counted from this process's own open sockets."""

from __future__ import annotations

import os
import stat
import threading

from django.conf import settings

from jobs.runtime import engine, engine_exec
from tests.helpers import busybox_with_tools


class Host:
    def __init__(self, base_url: str):
        self.base_url, self.name = base_url, "local"


def open_sockets() -> set[int]:
    """The inodes of this process's open sockets (a new connection is a new inode)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            info = os.stat(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor, closed since
            continue
        if stat.S_ISSOCK(info.st_mode):
            found.add(info.st_ino)
    return found


def on_a_thread_of_its_own(call):
    """Run call on a new thread (a client of its own: clients are per thread); return its result."""
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # raised in the test's thread, where pytest sees it
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_a_client_keeps_one_connection_to_its_engine_however_many_urls_it_calls(docker_client):
    """80 calls to 41 URLs leave no more than a socket or two open (one per URL stayed open before,
    up to the SDK's 25 pools a client)."""
    host = Host(settings.DEFAULT_DOCKER_URL)

    def forty_calls_to_forty_urls() -> tuple[set[int], set[int]]:
        engine.ping(host)  # the client made, its connection kept
        before = open_sockets()
        for n in range(40):  # a listing per label: each a URL of its own, as each container's path is
            engine.containers_labelled(host, f"console.test.connections={n}")
            engine.ping(host)
        after = open_sockets()
        engine.forget_client(host)  # this thread's clients closed, and their connections
        return before, after

    before, after = on_a_thread_of_its_own(forty_calls_to_forty_urls)
    # Other threads of the session (its worker's clients) may open or close sockets meanwhile: only
    # the ones this thread's calls made could number 40.
    assert len(after - before) <= 2, f"{len(after - before)} sockets opened by 80 calls to 41 URLs"


def test_calls_after_execs_on_the_same_client_take_a_working_connection(docker_client):
    """An exec's connection is taken over by its stream (the engine's `101 Switching Protocols`)
    and closed with it. With one pool for every URL, the next call of the same client, to any
    URL, must not get that connection back: each call below would fail on it."""
    made = busybox_with_tools(docker_client, ["sleep", "300"])
    host = Host(settings.DEFAULT_DOCKER_URL)

    def execs_then_calls() -> list:
        container = engine.container(host, made.id)
        seen = []
        for cmd, cap in ((["echo", "one"], 1024), (["sh", "-c", "yes | head -c 100000"], 10), (["sleep", "5"], 1024)):
            result = engine_exec.exec_bounded(container, cmd, timeout_s=1, max_bytes=cap)
            seen.append((result.stdout[:4], result.truncated, result.timed_out))
            engine.refresh(container)  # the container's own URL
            seen.append(container.status)
            seen.append(len(engine.containers_labelled(host, f"console.test.connections={len(seen)}")))
            engine.ping(host)
        engine.forget_client(host)
        return seen

    try:
        seen = on_a_thread_of_its_own(execs_then_calls)
    finally:
        made.remove(force=True)
    assert seen == [
        (b"one\n", False, False), "running", 0,
        (b"y\ny\n", True, False), "running", 0,
        (b"", False, True), "running", 0,
    ]  # fmt: skip
