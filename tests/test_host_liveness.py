"""When a failed ping means a host is lost (jobs/runtime/liveness.host_lost), by table, and what
the engine's edge calls a ping that timed out, against real sockets (no Docker); and reconcile's
round of pings over silent sockets, a refused port and this machine's real engine."""

from __future__ import annotations

import socket
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from jobs.runtime import engine
from jobs.runtime.liveness import host_lost

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("timed_out", "seen_ago_s", "lost"),
    [
        (False, 1, True),  # refused or broken: a fact, at once
        (False, None, True),
        (True, None, True),  # never answered: nothing to wait for
        (True, 1, False),  # slow, answered a second ago
        (True, 14.9, False),
        (True, 15, True),  # silent for HOST_LOST_AFTER_S
        (True, 600, True),
    ],
)
def test_a_failed_ping_means_a_lost_host(timed_out, seen_ago_s, lost):
    seen = None if seen_ago_s is None else NOW - timedelta(seconds=seen_ago_s)
    assert host_lost(timed_out, seen, NOW, lost_after_s=15) is lost


class Host:
    def __init__(self, base_url: str):
        self.base_url, self.name = base_url, "h"


def test_an_engine_that_takes_the_connection_and_never_answers_timed_out(tmp_path):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "silent.sock"))
    listener.listen(8)
    taken = []
    threading.Thread(target=lambda: taken.append(listener.accept()), daemon=True).start()
    try:
        with pytest.raises(engine.NoAnswerInTime):
            engine.ping(Host(f"unix://{tmp_path}/silent.sock"), timeout=1)
    finally:
        listener.close()


def test_an_engine_that_is_not_there_is_unreachable_not_slow(tmp_path):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "gone.sock"))
    listener.close()  # the socket file stays, nothing listens: refused, as after a dockerd's SIGKILL
    with pytest.raises(engine.Unreachable) as refused:
        engine.ping(Host(f"unix://{tmp_path}/gone.sock"), timeout=1)
    assert not isinstance(refused.value, engine.NoAnswerInTime)


def test_a_tcp_engine_that_refuses_is_unreachable_not_slow():
    """urllib3 files a refused connection (NewConnectionError) under its connect timeout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(engine.Unreachable) as refused:
        engine.ping(Host(f"tcp://127.0.0.1:{port}"), timeout=1)
    assert not isinstance(refused.value, engine.NoAnswerInTime)


def test_a_tcp_engine_that_never_answers_timed_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        with pytest.raises(engine.NoAnswerInTime):
            engine.ping(Host(f"tcp://127.0.0.1:{listener.getsockname()[1]}"), timeout=1)
    finally:
        listener.close()


def test_errors_that_carry_text_where_an_error_may_be_are_read_without_raising():
    """ssl.SSLError's `reason` is a str ('SSLV3_ALERT_BAD_CERTIFICATE'): a TLS engine refusing a
    certificate made the classification raise (a full run); a refusal is not a timeout."""
    import ssl

    import requests
    import urllib3

    refused = ssl.SSLError(1, "[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate")
    refused.reason = "SSLV3_ALERT_BAD_CERTIFICATE"
    wrapped = urllib3.exceptions.MaxRetryError(None, "/_ping", urllib3.exceptions.SSLError(refused))
    assert not engine._timed_out(requests.exceptions.SSLError(wrapped))
    slow = urllib3.exceptions.MaxRetryError(None, "/_ping", urllib3.exceptions.ReadTimeoutError(None, "/_ping", "x"))
    assert engine._timed_out(requests.exceptions.ConnectionError(slow))


@pytest.mark.django_db
def test_reconcile_pings_every_host_at_once_and_isolates_only_the_lost_one(docker_client):
    """Five engines take the connection and never answer. One after the other, each held the
    sweep for a timeout (a healthy host's last answer aged past HOST_LOST_AFTER_S, every other
    reconcile step waited): every one of them must have been asked before any ping gave up.
    The slow ones answered recently, so they stay; the refused one is isolated; the healthy one
    (this machine's real engine) is marked seen."""
    from django.conf import settings

    from jobs.models import DockerHost
    from jobs.runtime.reconcile import check_hosts

    events: list[tuple[str, int]] = []
    listeners = []

    def silent(index: int, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        events.append(("asked", index))
        while conn.recv(4096):  # the request, then nothing until the client gives up and closes
            pass
        events.append(("gave up", index))

    a_second_ago = timezone.now() - timedelta(seconds=1)
    for index in range(5):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listeners.append(listener)
        threading.Thread(target=silent, args=(index, listener), daemon=True).start()
        DockerHost.objects.create(
            name=f"slow-{index}", base_url=f"tcp://127.0.0.1:{listener.getsockname()[1]}", last_seen_at=a_second_ago
        )
    DockerHost.objects.create(name="healthy", base_url=settings.DEFAULT_DOCKER_URL)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        refused_port = probe.getsockname()[1]  # closed again: nothing listens there
    DockerHost.objects.create(name="gone", base_url=f"tcp://127.0.0.1:{refused_port}", last_seen_at=a_second_ago)
    try:
        assert check_hosts() is True
    finally:
        for listener in listeners:
            listener.close()
    assert [kind for kind, _ in events[:5]] == ["asked"] * 5, events
    isolated = dict(DockerHost.objects.values_list("name", "isolated"))
    assert isolated == {"healthy": False, "gone": True} | {f"slow-{i}": False for i in range(5)}
    assert DockerHost.objects.get(name="healthy").last_seen_at > a_second_ago


@pytest.mark.django_db
def test_the_ping_thread_of_an_engine_no_longer_pinged_ends(docker_client):
    """One ping thread per engine URL, kept between rounds (its connection with it); once the
    host is gone (deleted, isolated, its URL changed) the next round lets its thread end."""
    import time

    from django.conf import settings

    from jobs.models import DockerHost
    from jobs.runtime import liveness
    from jobs.runtime.reconcile import check_hosts

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        refused = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    DockerHost.objects.create(name="healthy", base_url=settings.DEFAULT_DOCKER_URL)
    gone = DockerHost.objects.create(name="pinged-once", base_url=refused)

    def ping_threads() -> set[str]:
        return {t.name.rsplit("_", 1)[0] for t in threading.enumerate() if t.name.startswith("ping-")}

    check_hosts()  # the refused one is isolated in this round
    assert "ping-pinged-once" in ping_threads()
    assert DockerHost.objects.get(id=gone.id).isolated
    check_hosts()
    assert refused not in liveness._pingers
    deadline = time.monotonic() + 10
    while "ping-pinged-once" in ping_threads():
        assert time.monotonic() < deadline, "its thread is still there"
        time.sleep(0.05)
    assert "ping-healthy" in ping_threads(), "the engines still pinged keep theirs"
