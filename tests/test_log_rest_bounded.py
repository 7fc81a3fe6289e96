"""The rest of an ended container's log, read once by its follower's own thread (follow=0), from an
engine that stops answering or goes away mid-answer.

The follower's client has no timeout (a followed log may be silent for hours) and the follower
makes no heartbeat while it reads: a read without end held the run, undecided, for good. A read
that broke off was taken for the log's end, and the run was marked exited without its last lines.
Now each wait is bounded and a break is the engine's error: the follower asks whether the host is
still there and reads again from the last line taken (jobs/runtime/follow.py)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from django.utils import timezone

from jobs.models import Attempt, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, engine, logs
from tests.conftest import BUSYBOX
from tests.test_sampler_clients import Host, returns_within

FRAME = b"2026-12-06T00:00:00.000000001Z the line before the engine stopped\n"
HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def one_chunk(frame: bytes) -> bytes:
    body = struct.pack(">BxxxL", 1, len(frame)) + frame
    return b"%x\r\n%s\r\n" % (len(body), body)


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """A unix socket standing for an engine: `answer` (set by the test) is what it sends after a
    request's headers; `then_close` whether it then hangs up (else it holds the connection)."""
    path = tmp_path / "engine.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(16)
    held: list[socket.socket] = []
    behaviour = {"answer": b"", "then_close": False}

    def serve(conn: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            data = conn.recv(4096)
            if not data:
                return
            request += data
        if behaviour["answer"]:
            conn.sendall(behaviour["answer"])
        if behaviour["then_close"]:
            conn.close()

    def accept_forever() -> None:
        while True:
            try:
                conn = listener.accept()[0]
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True).start()
    host = Host(f"unix://{path}")
    monkeypatch.setitem(engine._api_versions, host.base_url, "1.41")
    monkeypatch.setattr(engine, "LOG_REST_TIMEOUT_S", 1)
    host.behaviour = behaviour
    yield host
    listener.close()
    for conn in held:
        conn.close()


def followers_handle(host: Host):
    """The container as a follower holds it: through its thread's client, which has no timeout."""
    return engine.client_for(host, timeout=None).containers.prepare_model({"Id": "e" * 64, "Name": "/ended"})


def read_rest(handle) -> tuple[list[bytes], BaseException | None]:
    got: list[bytes] = []
    try:
        for batch in engine.log_stream(handle, follow=False).batches():
            got.extend(batch)
    except engine.EngineError as exc:
        return got, exc
    return got, None


def test_an_engine_that_never_answers_the_read_gives_up_within_its_bound(fake_engine):
    started = time.monotonic()
    returned, outcome = returns_within(20, lambda: read_rest(followers_handle(fake_engine)))
    assert returned, "the rest of the log waited on a silent engine without end"
    assert outcome == ([], outcome[1]) and isinstance(outcome[1], engine.NoAnswerInTime)
    assert time.monotonic() - started < 10


def test_an_engine_that_stops_sending_mid_answer_gives_up_after_what_came(fake_engine):
    fake_engine.behaviour["answer"] = HEADERS + one_chunk(FRAME)
    returned, outcome = returns_within(20, lambda: read_rest(followers_handle(fake_engine)))
    assert returned, "the rest of the log waited without end after its first line"
    got, error = outcome
    assert got == [FRAME]
    assert isinstance(error, engine.NoAnswerInTime)


def test_an_engine_that_hangs_up_mid_answer_is_an_error_not_the_logs_end(fake_engine):
    fake_engine.behaviour.update(answer=HEADERS + one_chunk(FRAME), then_close=True)
    got, error = read_rest(followers_handle(fake_engine))
    assert got == [FRAME]
    assert isinstance(error, engine.Unreachable), "a broken answer was taken for the whole rest of the log"


def test_the_whole_rest_ends_the_read_without_error(fake_engine):
    fake_engine.behaviour.update(answer=HEADERS + one_chunk(FRAME) + b"0\r\n\r\n", then_close=True)
    assert read_rest(followers_handle(fake_engine)) == ([FRAME], None)


@pytest.mark.django_db(transaction=True)  # the follower reads the run from its own thread
def test_a_followers_drain_read_of_a_silent_engine_raises_the_engines_error(fake_engine, demo):
    """The follower's own read (Follower.follow, ended=True) hands the error to its caller, which
    asks whether the host is still there and reads again; what it persisted is what it acknowledged."""
    fake_engine.behaviour["answer"] = HEADERS + one_chunk(FRAME)
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name="drained", image=BUSYBOX, command="true")
    job.full_clean()
    job.save()
    attempt = Attempt.objects.create(job=job, number=1, level="initial", state=Attempt.State.RUNNING)
    follower = logs.Follower(0)
    run = TaskRun.objects.create(
        attempt=attempt,
        index=0,
        host=demo.host,
        container_name=docker_hosts.container_name(job, 1, 0),
        container_id="e" * 64,
        state=TaskRun.State.EXITED,
        follower_token=follower.token,
        follower_heartbeat=timezone.now(),  # a live follower's: the suite's worker leaves it alone
    )
    follower.task_run_id = run.id
    returned, outcome = returns_within(20, lambda: follower.follow(run, followers_handle(fake_engine), ended=True))
    assert returned, "the follower's drain read held its thread on a silent engine"
    assert isinstance(outcome, engine.NoAnswerInTime)
    run.refresh_from_db()
    assert logs.log_path(run).stat().st_size == run.log_bytes
    assert [line.payload for line in logs.read_lines(run)] == ([FRAME[31:-1]] if run.log_lines else [])
    assert TaskRun.objects.filter(id=run.id, follower_token=follower.token).exists()
