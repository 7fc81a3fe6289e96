"""What the tests of the console's bounded calls to an engine use: a stand-in host, a call run on
a thread of its own with a deadline, a fake engine on a socket that answers (or never does) as a
test's route says, a running instance on such a host, and a followed log through a client whose
calls are bounded (run against a real engine over each kind of connection); stand-in containers
that count how many removals run at once (the engine's clear-up slots)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from types import SimpleNamespace

from django.utils import timezone

from jobs.models import Attempt, DockerHost, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, engine
from tests.helpers import BUSYBOX
from tests.pytest_env import TEST_LABEL


class Host:
    def __init__(self, base_url: str):
        self.base_url, self.name = base_url, "h"


def returns_within(seconds: float, call) -> tuple[bool, object]:
    """Run call on a thread of its own: (whether it returned in time, what it returned or raised)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return (not thread.is_alive(), outcome[0] if outcome else None)


def running_run(demo, host: DockerHost, name: str) -> TaskRun:
    """A job's one instance, running on `host` (a fake engine) in its first attempt, followed by
    nobody yet."""
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name=name, image=BUSYBOX, command="true")
    job.full_clean()
    job.save()
    attempt = Attempt.objects.create(
        job=job, number=1, level="initial", state=Attempt.State.RUNNING, started_at=timezone.now()
    )
    return TaskRun.objects.create(
        attempt=attempt,
        index=0,
        host=host,
        container_name=docker_hosts.container_name(job, 1, 0),
        container_id="e" * 64,
        state=TaskRun.State.RUNNING,
        started_at=timezone.now(),
    )


def serve_engine(listener: socket.socket, route) -> list[socket.socket]:
    """Answers each connection's requests with route(request line) -> (bytes, then hang up); an
    answer without a hang-up keeps the connection for the next request (or holds it, silent)."""
    held: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        try:
            answer_requests(conn)
        except OSError:
            pass  # the test closed the connection (its clean-up) while this thread used it

    def answer_requests(conn: socket.socket) -> None:
        pending = b""
        while True:
            while b"\r\n\r\n" not in pending:
                data = conn.recv(4096)
                if not data:
                    return
                pending += data
            request, _, pending = pending.partition(b"\r\n\r\n")
            answer, hang_up = route(request.split(b"\r\n", 1)[0].decode())
            if answer:
                conn.sendall(answer)
            if hang_up == "reset":  # an RST, not a FIN, once the answer had time to arrive
                time.sleep(0.3)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if hang_up:
                conn.close()
                return

    def accept_forever() -> None:
        while True:
            try:
                conn = listener.accept()[0]
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True).start()
    return held


def followed_through_a_bounded_client(host, docker_client) -> None:
    """A followed log, through a client whose calls wait at most 1 s, quiet for 5 s between two
    lines: both lines come, and the stream ends with the container, not with the client's bound.
    The stream waits at least 2 s (twice the bound) once opened: the quiet starts with the
    container, and the look-up and the stream's opening (over ssh, on a busy machine) take up to
    a few seconds of it."""
    made = docker_client.containers.run(
        BUSYBOX,
        ["sh", "-c", "echo one; sleep 5; echo two"],
        detach=True,
        labels=dict([TEST_LABEL]),
        network_mode="none",
    )
    try:
        stream = engine.log_stream(engine.container(host, made.id, timeout=1))
        started = time.monotonic()
        returned, outcome = returns_within(30, lambda: [f.split(b" ", 1)[1] for b in stream.batches() for f in b])
        assert returned and outcome == [b"one\n", b"two\n"], outcome
        assert time.monotonic() - started >= 2
    finally:
        made.remove(force=True)


class StandInContainer:
    """Has what remove_container and clear_away use: `.remove(force=True)` and its client's URL."""

    def __init__(self, base_url: str, tracker: dict, hold: threading.Event | None = None, seconds: float = 0.05):
        self.client = SimpleNamespace(api=SimpleNamespace(base_url=base_url))
        self.tracker, self.hold, self.seconds = tracker, hold, seconds

    def remove(self, force: bool = False, v: bool = False) -> None:
        with self.tracker["lock"]:
            self.tracker["now"] += 1
            self.tracker["most"] = max(self.tracker["most"], self.tracker["now"])
        try:
            if self.hold is not None:
                self.hold.wait(10)
            else:
                time.sleep(self.seconds)
        finally:
            with self.tracker["lock"]:
                self.tracker["now"] -= 1
                self.tracker["done"] += 1


def tracker() -> dict:
    return {"lock": threading.Lock(), "now": 0, "most": 0, "done": 0}
