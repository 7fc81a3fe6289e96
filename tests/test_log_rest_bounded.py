"""The rest of an ended container's log, read once by its follower's own thread (follow=0), from an
engine that stops answering or goes away mid-answer.

The follower's client has no timeout (a followed log may be silent for hours) and the follower
makes no heartbeat while it reads: a read without end held the run, undecided, for good. A read
that broke off was taken for the log's end, and the run was marked exited without its last lines.
Now each wait is bounded and a break is the engine's error: the follower asks whether the host is
still there and reads again from the last line taken (jobs/runtime/follow.py)."""

from __future__ import annotations

import json
import socket
import struct
import time

import docker
import pytest
from django.utils import timezone

from jobs.models import Attempt, DockerHost, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, engine, engine_clients, follow, logs
from tests.bounded_calls import Host, returns_within, running_run, serve_engine
from tests.helpers import BUSYBOX

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
    behaviour = {"answer": b"", "then_close": False}
    held = serve_engine(listener, lambda request_line: (behaviour["answer"], behaviour["then_close"]))
    host = Host(f"unix://{path}")
    monkeypatch.setitem(engine_clients._api_versions, host.base_url, "1.41")
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


LENGTH_HEADERS = HEADERS.replace(b"Transfer-Encoding: chunked", b"Content-Length: %d")


@pytest.mark.parametrize("then_close", [True, False], ids=["hangs-up", "goes-silent"])
def test_a_body_of_known_length_cut_short_is_the_engines_error(fake_engine, then_close):
    """Not chunked (an engine or proxy that sends a length): urllib3's own errors, read past
    requests, come out as the console's too (the follower's retry catches those only)."""
    body = struct.pack(">BxxxL", 1, len(FRAME)) + FRAME
    fake_engine.behaviour.update(answer=(LENGTH_HEADERS % (len(body) + 100)) + body, then_close=then_close)
    returned, outcome = returns_within(20, lambda: read_rest(followers_handle(fake_engine)))
    assert returned
    got, error = outcome
    assert got == [FRAME]
    assert isinstance(error, engine.NoAnswerInTime if not then_close else engine.Unreachable), repr(error)


def test_a_stream_the_engine_reset_closes_quietly(monkeypatch):
    """A tcp engine that resets the connection mid-answer: the read is the engine's error, and
    the follower's close of that stream afterwards raises nothing (shutting a reset socket down
    raised ENOTCONN out of the follower's error handling: no retry, no release of the run)."""
    monkeypatch.setattr(engine, "LOG_REST_TIMEOUT_S", 5)
    listener = socket.socket(socket.AF_INET)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    serve_engine(listener, lambda request_line: (HEADERS + one_chunk(FRAME), "reset"))
    try:
        client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{listener.getsockname()[1]}", version="1.41")
        handle = client.containers.prepare_model({"Id": "e" * 64, "Name": "/ended"})
        stream = engine.log_stream(handle, follow=False)
        batches = stream.batches()
        assert next(batches) == [FRAME]
        with pytest.raises(engine.Unreachable) as raised:
            next(batches)
        assert not isinstance(raised.value, engine.NoAnswerInTime), "no reset came: the read timed out"
        stream.close()
    finally:
        listener.close()


def test_the_whole_rest_ends_the_read_without_error(fake_engine):
    fake_engine.behaviour.update(answer=HEADERS + one_chunk(FRAME) + b"0\r\n\r\n", then_close=True)
    assert read_rest(followers_handle(fake_engine)) == ([FRAME], None)


@pytest.mark.django_db(transaction=True)  # the follower reads the run from its own thread
def test_a_followers_drain_read_of_a_silent_engine_keeps_what_came_and_raises_the_engines_error(fake_engine, demo):
    """The follower's own read (Follower.follow, ended=True) writes and acknowledges what came
    before the engine stopped, then hands the error to its caller, which asks whether the host is
    still there and reads again from there (an engine that stops at the same place each time
    would otherwise never give that line)."""
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
    assert [line.payload for line in logs.read_lines(run)] == [FRAME[31:-1]]
    assert TaskRun.objects.filter(id=run.id, follower_token=follower.token).exists()


SECOND = b"2026-12-06T00:00:00.500000000Z the line the engine gave on the second read\n"
INSPECT = {
    "Id": "e" * 64,
    "Name": "/ended",
    "State": {"Status": "exited", "Running": False, "ExitCode": 0, "OOMKilled": False},
    "Config": {"Labels": {}},
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("breaks_every_time", [False, True], ids=["once", "every-time"])
def test_the_rest_of_the_log_is_read_again_after_a_break_and_its_last_line_kept(tmp_path, demo, breaks_every_time):
    """The whole follower (follow_task_run) against an engine whose first read of an ended
    container's rest of the log breaks off before the last line, and the second gives it; or
    that breaks off every time: the run is marked exited after REST_OF_LOG_TRIES reads (the engine
    said it ended), with what came, not followed for ever."""
    path = tmp_path / "engine.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(16)
    rest_reads: list[str] = []

    def route(request_line: str) -> tuple[bytes, bool]:
        target = request_line.split(" ")[1]
        if target.endswith("/_ping"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK", False
        if target == "/version":
            body = json.dumps({"ApiVersion": "1.41", "Version": "20.10.24"}).encode()
        elif target.endswith("/json"):
            body = json.dumps(INSPECT).encode()
        elif "/logs?" in target and "follow=1" in target:
            return HEADERS + one_chunk(FRAME) + b"0\r\n\r\n", False  # the followed log ends
        elif "/logs?" in target:
            rest_reads.append(target)
            if len(rest_reads) == 1 or breaks_every_time:
                return HEADERS + one_chunk(FRAME), True  # breaks off before the last line
            return HEADERS + one_chunk(FRAME) + one_chunk(SECOND) + b"0\r\n\r\n", False
        else:
            body = b'{"message": "not here"}'
            return b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                len(body),
                body,
            ), False
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        ), False

    held = serve_engine(listener, route)
    try:
        host = DockerHost.objects.create(name="breaks-off", base_url=f"unix://{path}", pool=demo.pool)
        run = running_run(demo, host, "rest")
        returned, outcome = returns_within(60, lambda: follow.follow_task_run(run.id))
        assert returned and outcome is True, repr(outcome)
        run.refresh_from_db()
        assert run.state == TaskRun.State.EXITED and run.exit_code == 0
        if breaks_every_time:
            assert [line.payload for line in logs.read_lines(run)] == [FRAME[31:-1]]
            assert len(rest_reads) == follow.REST_OF_LOG_TRIES
        else:
            assert [line.payload for line in logs.read_lines(run)] == [FRAME[31:-1], SECOND[31:-1]]
            assert len(rest_reads) == 2
    finally:
        listener.close()
        for conn in held:
            conn.close()
