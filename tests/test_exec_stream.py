"""What an exec prints right away is not lost when the console reads the engine's answer late.

The engine answers an exec's start with `101 Switching Protocols` and streams the output on the
same connection; the HTTP parser reads the headers through a buffer, which takes the output too
when it is already there (a command that ended at once, and a worker too busy to read the answer
at once). The SDK hands out the socket under that buffer: read alone, a metrics scrape came back
with exit 0 and no output (a full run's Metrics tab showed "0 samples"). Here the console's read
of the answer is held back (a busy worker, injected by delaying http.client's header parsing);
the engine and the containers are real."""

from __future__ import annotations

import http.client
import time

import pytest

from jobs.runtime import engine, engine_exec
from tests.helpers import busybox_with_tools


@pytest.fixture
def slow_reader(monkeypatch):
    """The console reads each HTTP answer's headers 0.3 s late: the output is there by then."""
    begin = http.client.HTTPResponse.begin

    def late_begin(self):
        time.sleep(0.3)
        return begin(self)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)


@pytest.fixture
def container(docker_client):
    made = busybox_with_tools(
        docker_client,
        ["sh", "-c", "printf 'loss 0.5\\n' > /tmp/metrics; nc -ll -p 7000 -e echo hello-from-the-app & sleep 300"],
    )
    time.sleep(0.5)  # its printf and nc
    yield made
    made.remove(force=True)


def test_a_command_that_ends_at_once_keeps_its_output(container, slow_reader):
    for _ in range(3):
        result = engine_exec.exec_bounded(container, ["cat", "/tmp/metrics"], timeout_s=5)
        assert (result.exit_code, result.stdout, result.timed_out) == (0, b"loss 0.5\n", False)
    result = engine_exec.exec_bounded(container, ["sh", "-c", "echo out; echo err >&2"], timeout_s=5)
    assert (result.stdout, result.stderr) == (b"out\n", b"err\n")


def test_a_relay_keeps_the_apps_first_words(container, slow_reader):
    relay = engine_exec.open_relay(container, 7000)
    try:
        assert relay.read() == b"hello-from-the-app\n"
    finally:
        relay.close()


def test_an_engine_gone_mid_answer_is_the_engines_error_not_a_timeout(container, monkeypatch):
    """A read that timed out is the command's (timed_out); a connection reset under the answer is
    the engine's (Unreachable, as any call at the edge): the caller must not record that the
    command hung. The engine and the exec are real; the reset is injected into the frame read."""

    def frames_then(error):
        def frames(first, sock):
            yield engine_exec.STDOUT_FRAME, b"par"
            raise error

        return frames

    monkeypatch.setattr(engine_exec, "multiplexed_frames", frames_then(TimeoutError("timed out")))
    result = engine_exec.exec_bounded(container, ["cat", "/tmp/metrics"], timeout_s=5)
    assert result.timed_out
    monkeypatch.setattr(engine_exec, "multiplexed_frames", frames_then(ConnectionResetError(104, "reset")))
    with pytest.raises(engine.Unreachable):
        engine_exec.exec_bounded(container, ["cat", "/tmp/metrics"], timeout_s=5)


def test_a_stream_over_a_pipe_is_not_waited_on():
    """An ssh:// host's exec comes through a pipe to its ssh process, not a socket: the buffered
    bytes cannot be taken without a read that would wait for the command to speak (unit: no
    engine; the read is bounded by the test's thread join)."""
    import io
    import os
    import threading
    from types import SimpleNamespace

    read_end, write_end = os.pipe()
    try:
        buffered = io.BufferedReader(io.FileIO(read_end, "rb", closefd=False))
        sock = SimpleNamespace(gettimeout=lambda: None, settimeout=lambda _t: None)
        raw = SimpleNamespace(
            _response=SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(fp=buffered))), _sock=sock
        )
        got = []
        reader = threading.Thread(target=lambda: got.append(engine_exec.read_past_headers(raw)), daemon=True)
        reader.start()
        reader.join(2)
        assert got == [b""], "read_past_headers waited on an empty pipe"
    finally:
        os.close(write_end)
        os.close(read_end)
