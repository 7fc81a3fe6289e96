"""An ssh:// Docker host (README "More Docker hosts"): the console reaches its engine through the
system `ssh` client running `docker system dial-stdio` on the host, over that process's pipes.

No sshd on this machine kind: an `ssh` on PATH stands in for the remote end (tests/bin/ssh). It is
a real process with real pipes, as the SDK's transport expects; forwarding, it joins them to this
machine's engine (what dial-stdio does on the host); silent, it reads what the console asks and
never answers (an engine behind ssh that stopped). Everything between the console and that
process is the SDK's and the console's own code. A whole job on such a host:
tests/test_ssh_host_job.py."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from jobs.models import DockerHost
from jobs.runtime import engine, engine_clients, engine_exec
from jobs.runtime.timed_pipes import PipeReader
from tests.bounded_calls import followed_through_a_bounded_client
from tests.helpers import busybox_with_tools
from tests.processes import STAND_IN_SSH_DIR


@pytest.fixture
def ssh_host(tmp_path, monkeypatch):
    """A DockerHost whose base_url is ssh://, reached through the stand-in `ssh` (tests/bin/ssh,
    mode given by the test), and forgotten at the end (its ssh processes ended)."""
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("PATH", f"{STAND_IN_SSH_DIR}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CONSOLE_TEST_SSH_LOG", str(log))
    local = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    monkeypatch.setenv("CONSOLE_TEST_SSH_ENGINE", local.removeprefix("unix://"))
    host = DockerHost(name="over-ssh", base_url=f"ssh://deploy@gpu-{uuid.uuid4().hex[:8]}")
    host.ssh_log = log
    yield host
    engine.forget_client(host)


def call_bounded(func, deadline_s: float = 60):
    """func() on a thread of its own, waited for at most deadline_s: (returned, raised)."""
    outcome: dict = {}

    def run():
        try:
            outcome["returned"] = func()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline_s)
    assert not thread.is_alive(), f"still waiting after {deadline_s} s: the call has no timeout"
    return outcome.get("returned"), outcome.get("raised")


def test_an_ssh_engine_is_asked_through_the_ssh_clients_pipe(ssh_host, docker_client):
    made = busybox_with_tools(docker_client, ["sleep", "300"])
    try:
        container = engine.container(ssh_host, made.id)
        assert container.id == made.id
        # An exec streams its output back over the same pipe, the console's bounded read on it.
        result = engine_exec.exec_bounded(container, ["sh", "-c", "echo out; echo err >&2"], timeout_s=10)
        assert (result.exit_code, result.stdout, result.stderr) == (0, b"out\n", b"err\n")
        result = engine_exec.exec_bounded(container, ["sh", "-c", "sleep 1; echo late"], timeout_s=10)
        assert (result.exit_code, result.stdout) == (0, b"late\n")
        # A followed log (a follower's: no read timeout), closed from another thread while its
        # read waits for lines that do not come.
        container.exec_run(["sh", "-c", "echo one > /proc/1/fd/1; echo two > /proc/1/fd/1"])
        stream = engine.log_stream(engine.container(ssh_host, made.id, timeout=None))
        batches = stream.batches()
        lines = []
        while len(lines) < 2:
            lines += [frame.split(b" ", 1)[1] for frame in next(batches)]
        assert lines == [b"one\n", b"two\n"]
        threading.Timer(1, stream.close).start()
        returned, raised = call_bounded(lambda: list(batches))
        assert raised is None or isinstance(raised, engine.Unreachable), raised
    finally:
        made.remove(force=True)
    asked = ssh_host.ssh_log.read_text().splitlines()
    assert asked and all(
        line.endswith(f"-- {ssh_host.base_url[6:].split('@')[1]} docker system dial-stdio") for line in asked
    )
    assert all(line.startswith("-l deploy") for line in asked)


def test_an_ssh_engine_that_stops_answering_times_out_instead_of_holding_the_caller(ssh_host, monkeypatch):
    monkeypatch.setenv("CONSOLE_TEST_SSH_MODE", "silent")
    started = time.monotonic()
    returned, raised = call_bounded(lambda: engine.container(ssh_host, "anything", timeout=2))
    assert returned is None
    assert isinstance(raised, engine.NoAnswerInTime), raised
    assert time.monotonic() - started < 30  # its 2-s timeout, not for ever (a deadline, not a timing)


@pytest.fixture
def ssh_socket(ssh_host, monkeypatch):
    """The console's socket over a stand-in `ssh` that reads and never answers, connected."""
    monkeypatch.setenv("CONSOLE_TEST_SSH_MODE", "silent")
    sock = engine_clients._SSHSocketWithTimeouts(ssh_host.base_url.removeprefix("ssh://"))
    sock.settimeout(5)
    sock.connect()
    yield sock
    sock.close()


def test_a_read_after_close_gives_the_end_not_what_its_descriptor_number_was_given_to_since(ssh_socket):
    number = ssh_socket._reader.raw.fileno()
    ssh_socket.close()
    # The freed number taken by another connection's pipe, with an answer waiting in it.
    other_read, other_write = os.pipe()
    try:
        if other_read != number:
            os.dup2(other_read, number)
        os.write(other_write, b"another connection's answer")
        assert ssh_socket.recv(100) == b""
    finally:
        for fd in {other_read, other_write, number}:
            os.close(fd)


def test_a_closed_connection_refuses_writes_as_a_socket_does(ssh_socket):
    ssh_socket.sendall(b"GET /_ping HTTP/1.1\r\n")  # open: the process reads it
    ssh_socket.close()
    with pytest.raises(BrokenPipeError):  # an OSError: the engine edge's Unreachable
        ssh_socket.sendall(b"GET /_ping HTTP/1.1\r\n")


def test_an_ssh_that_stops_reading_times_out_a_write_instead_of_holding_the_caller(ssh_host, monkeypatch):
    """More bytes than the pipe holds (a relay's, a terminal's paste) to an ssh that takes nothing:
    the SDK's blocking write waited for ever; it waits no longer than the call's timeout."""
    monkeypatch.setenv("CONSOLE_TEST_SSH_MODE", "deaf")
    sock = engine_clients._SSHSocketWithTimeouts(ssh_host.base_url.removeprefix("ssh://"))
    sock.settimeout(1)
    sock.connect()
    try:

        def send() -> None:
            with engine._edge():
                sock.sendall(b"\0" * (4 * 1024 * 1024))

        started = time.monotonic()
        _, raised = call_bounded(send, deadline_s=30)
        assert isinstance(raised, engine.NoAnswerInTime), raised
        assert time.monotonic() - started < 20  # its 1-s timeout, not for ever (a deadline, not a timing)
    finally:
        call_bounded(sock.close, deadline_s=30)  # the process ended, the pipes closed
    with pytest.raises(BrokenPipeError):
        sock.sendall(b"GET /_ping HTTP/1.1\r\n")


class OneSecond:
    """What a PipeReader asks of its socket: a timeout of one second."""

    def gettimeout(self) -> float:
        return 1.0


ONE_SECOND = OneSecond()


def test_the_pipe_is_waited_on_at_any_descriptor_number():
    """A worker following hundreds of instances holds more than 1024 descriptors: select() cannot
    wait on one numbered past that, poll can."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = 1500
    if hard != resource.RLIM_INFINITY and hard <= high:
        pytest.skip(f"this process may not hold descriptor {high} (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, high + 1), hard))
    read_end, write_end = os.pipe()
    try:
        os.dup2(read_end, high)
        os.close(read_end)
        pipe = open(high, "rb", buffering=0)  # noqa: SIM115 - the reader closes it

        raw = PipeReader(pipe, ONE_SECOND)
        os.write(write_end, b"answer")
        buffer = bytearray(16)
        assert raw.readinto(buffer) == 6 and bytes(buffer[:6]) == b"answer"
        with pytest.raises(TimeoutError):  # nothing more within the socket's timeout
            raw.readinto(buffer)
        raw.end()
        assert pipe.closed and raw.readinto(buffer) == 0
    finally:
        os.close(write_end)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_followed_log_over_ssh_outlives_its_clients_bound(ssh_host, docker_client):
    """A follower's client is bounded now (follow.FOLLOWER_CALL_TIMEOUT_S); over ssh:// too its
    followed log turns its socket's timeout off (the console's socket over the ssh pipes)."""
    followed_through_a_bounded_client(ssh_host, docker_client)


def ssh_started(host) -> int:
    """How many `ssh` processes the console has started for the host (the stand-in logs each)."""
    return len(host.ssh_log.read_text().splitlines()) if host.ssh_log.exists() else 0


def kept_connections(host) -> list:
    """The idle connections kept for the host (urllib3 fills the rest of its queue with None)."""
    pool = engine_clients._ssh_pools.get((os.getpid(), host.base_url))
    return [conn for conn in pool.pool.queue if conn is not None] if pool else []


def test_calls_to_an_ssh_engine_take_kept_connections_not_an_ssh_each(ssh_host, docker_client):
    """Each call started an `ssh` here and a `docker system dial-stdio` on the host (the SDK made a
    pool per request): ~300 ms a call over a real sshd (bench/ssh_engine.py). The connections are
    kept and shared by the process's threads, and every answer is still the one asked for: after
    a job's flood cut at its cap (its bytes never reach the next call), and from eight threads at once."""
    first = busybox_with_tools(docker_client, ["sleep", "300"])
    second = busybox_with_tools(docker_client, ["sleep", "300"])
    try:
        pairs = [(first.id, second.id), (second.id, first.id)]

        def ask(times: int) -> list[bool]:
            answers = []
            for n in range(times):
                wanted, other = pairs[n % 2]
                answers.append(engine.container(ssh_host, wanted).id == wanted)
                answers.append(engine.container(ssh_host, other).id == other)
            return answers

        assert all(ask(15))
        assert ssh_started(ssh_host) <= 2, ssh_started(ssh_host)  # 31 before

        flood = engine_exec.exec_bounded(
            engine.container(ssh_host, first.id), ["sh", "-c", "yes job | head -c 1000000"], max_bytes=10
        )
        assert flood.truncated and flood.stdout.startswith(b"job\n")
        assert all(ask(5))
        assert ssh_started(ssh_host) <= 4  # the exec's connection went with its stream

        results: list = []
        threads = [threading.Thread(target=lambda: results.append(call_bounded(lambda: ask(10)))) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [raised for _, raised in results] == [None] * 8
        assert all(all(answers) for answers, _ in results)
        assert ssh_started(ssh_host) <= 4 + 8, ssh_started(ssh_host)  # at most one more per thread at once
        assert 1 <= len(kept_connections(ssh_host)) <= engine_clients.KEPT_SSH_CONNECTIONS
    finally:
        first.remove(force=True)
        second.remove(force=True)


def test_a_kept_connection_whose_ssh_ended_is_not_used_again(ssh_host, docker_client):
    """The ssh of an idle connection ended (killed, or its network went): the next call connects
    anew instead of failing on it."""
    made = busybox_with_tools(docker_client, ["sleep", "300"])
    try:
        assert engine.container(ssh_host, made.id).id == made.id
        (kept,) = kept_connections(ssh_host)
        kept.sock.proc.kill()
        kept.sock.proc.wait(10)
        assert engine.container(ssh_host, made.id).id == made.id
        assert ssh_started(ssh_host) == 2
    finally:
        made.remove(force=True)


def test_an_idle_pipe_with_something_to_read_is_not_fit_for_a_request():
    """Nothing is sent to an idle HTTP connection: bytes, or the end, in its pipe mean it is done."""
    read_end, write_end = os.pipe()

    raw = PipeReader(open(read_end, "rb", buffering=0), ONE_SECOND)  # noqa: SIM115 - the reader closes it
    assert not raw.has_input()
    os.write(write_end, b"x")
    assert raw.has_input()
    raw.readinto(bytearray(1))
    assert not raw.has_input()
    os.close(write_end)
    assert raw.has_input()  # the end
    raw.end()
    assert raw.has_input()


def break_unseen(host, conn) -> None:
    """The stand-in behind the kept connection breaks it at the next request (tests/bin/ssh)."""
    Path(f"{host.ssh_log}.broken.{conn.sock.proc.pid}").touch()


def test_a_kept_connection_the_host_dropped_unseen_is_asked_again_by_a_ping(ssh_host, docker_client):
    """A kept connection dead without a word (the host rebooted, a firewall's idle timeout) shows
    only when a call goes out on it, and fails as a refusal does: a ping would isolate a host that
    answers. The ping asks again on a new connection before it counts (liveness._ping)."""
    from jobs.runtime import liveness

    made = busybox_with_tools(docker_client, ["sleep", "300"])
    try:
        engine.container(ssh_host, made.id)
        (kept,) = kept_connections(ssh_host)
        break_unseen(ssh_host, kept)
        with pytest.raises(engine.Unreachable) as refused:
            engine.ping(ssh_host)
        assert not isinstance(refused.value, engine.NoAnswerInTime)  # a refusal: the host "lost" at once
        engine.container(ssh_host, made.id)
        (kept,) = kept_connections(ssh_host)
        break_unseen(ssh_host, kept)
        assert liveness._ping(ssh_host, 5) is None  # answered, on the second connection asked
        assert ssh_started(ssh_host) == 3
    finally:
        made.remove(force=True)


def test_kept_connections_unused_for_a_while_are_closed(ssh_host, docker_client, monkeypatch):
    """Not taken again once unused for KEPT_SSH_IDLE_S (the host may have dropped them), and
    closed then by any client handed out: an engine no longer asked keeps no ssh here."""
    engine.ping(ssh_host)
    (first,) = kept_connections(ssh_host)
    monkeypatch.setattr(engine_clients, "KEPT_SSH_IDLE_S", 0.0)
    engine.ping(ssh_host)
    assert ssh_started(ssh_host) == 2 and first.sock is None  # closed on the way, not reused
    (second,) = kept_connections(ssh_host)
    ssh = second.sock.proc
    engine.client_for(type("Local", (), {"base_url": settings.DEFAULT_DOCKER_URL})())  # another engine's
    assert kept_connections(ssh_host) == [] and ssh.wait(10) is not None


def test_a_request_whose_pool_was_forgotten_meanwhile_connects_anew(ssh_host):
    """forget_client (another thread's broken stream) closes the engine's pool after a request of
    this thread took it: that request gets a connection of its own, not "Pool is closed" (a refusal
    to the console, which would isolate the host)."""
    client = engine.client_for(ssh_host)
    pool = client.api._custom_adapter.get_connection("http+docker://ssh/_ping")
    engine.forget_client(ssh_host)
    response = pool.urlopen("GET", "/_ping", timeout=5)  # (the SDK sets the pool's default to a bare int)
    assert (response.status, response.data) == (200, b"OK")
