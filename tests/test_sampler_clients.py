"""What a follower's container handle may be used for from other threads, and for how long.

A follower looks its container up through its own thread's client, which has no timeout: the
log it reads may be silent for hours. Its Sampler's turns run on the sampling pool's threads,
and the hang watch's GPU reading and a hang's stacks are execs. Through the follower's handle
an engine that took an exec's create and never answered held the thread for good, and the pool
threads used the follower thread's client (clients are per thread: engine.client_for)."""

from __future__ import annotations

import socket
import threading
import time

import docker
import pytest
from django.conf import settings

from jobs.runtime import engine, engine_clients, engine_exec, hang
from tests.bounded_calls import Host, returns_within
from tests.helpers import BUSYBOX
from tests.pytest_env import TEST_LABEL


@pytest.fixture
def silent_engine(tmp_path, monkeypatch):
    """A unix socket that takes every connection and never answers (an engine stuck behind a
    lock); its API version known already, as a worker that followed there before knows it."""
    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept_forever() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept_forever, daemon=True).start()
    host = Host(f"unix://{path}")
    monkeypatch.setitem(engine_clients._api_versions, host.base_url, "1.41")
    yield host
    listener.close()
    for conn in held:
        conn.close()


def test_an_exec_through_a_followers_handle_gives_up_on_an_engine_that_never_answers(silent_engine):
    followers_handle = engine.client_for(silent_engine, timeout=None).containers.prepare_model(
        {"Id": "f" * 64, "Name": "/silent"}
    )
    started = time.monotonic()
    returned, outcome = returns_within(30, lambda: engine_exec.exec_bounded(followers_handle, ["true"], timeout_s=1))
    assert returned, "the exec's create waited on the silent engine without end"
    assert isinstance(outcome, engine.NoAnswerInTime)
    assert time.monotonic() - started < 10  # its own bound: the command's 1 s + 2


def test_a_sampler_turn_on_another_thread_has_its_own_bounded_client(docker_client):
    """The engine and the container are real: the turn reads the container's CPU through the
    turning thread's client (one with a timeout), never the follower's."""
    made = docker_client.containers.run(
        BUSYBOX, ["sh", "-c", "while :; do :; done"], detach=True, labels=dict([TEST_LABEL]), network_mode="none"
    )
    try:
        host = Host(settings.DEFAULT_DOCKER_URL)
        followers_client = engine.client_for(host, timeout=None)
        followers_handle = engine.container(host, made.id, timeout=None)
        used: list[object] = []

        def gpu(container) -> None:
            used.append(container.client)
            return None

        watch = hang.HangWatch(window_s=60, gpu_sampler=gpu, sample_inline=False)
        watch.last_activity -= 60  # silent for a minute: the turn samples
        sampler = hang.Sampler(watch, followers_handle, engine=host.base_url, host=host)
        returned, outcome = returns_within(30, sampler.turn)
        assert returned and outcome is None
        assert used and used[0] is not followers_client
        assert used[0].api.timeout == hang.SAMPLE_CLIENT_TIMEOUT_S
        assert watch.last_cpu_ns, "no CPU reading through the turning thread's client"
    finally:
        made.remove(force=True)


def test_a_turn_whose_engine_cannot_be_asked_its_version_records_no_usage(tmp_path):
    """The turning thread's first client of an engine asks its API version: an engine gone (or
    silent) then is a "no sample" like any other failed reading, not a turn that raises (every
    2 s a traceback, and neither the hang watch nor the chart heard of the miss)."""
    host = Host(f"unix://{tmp_path / 'nobody-listens.sock'}")
    assert host.base_url not in engine_clients._api_versions
    recorded: list[hang.Sample] = []

    class Chart:
        def due(self) -> bool:
            return True

        def record(self, sample: hang.Sample) -> None:
            recorded.append(sample)

    watch = hang.HangWatch(window_s=60, sample_inline=False)
    # The follower's handle (a client that asks nothing when made: its version given).
    handle = docker.DockerClient(base_url=host.base_url, version="1.41").containers.prepare_model(
        {"Id": "a" * 64, "Name": "/elsewhere"}
    )
    sampler = hang.Sampler(watch, handle, Chart(), engine=host.base_url, host=host)
    returned, outcome = returns_within(30, sampler.turn)
    assert returned and outcome is None, f"the turn raised {outcome!r}"
    assert [sample.usage for sample in recorded] == [hang.NO_USAGE]
