"""Whether a Docker host is still there (SPEC §4: a host is isolated on a lost connection).

A refused or broken connection is a fact: the host is lost. A call that timed out is an engine
busy or hung, which one call cannot tell apart: the host is lost only once it has answered no
ping for settings.HOST_LOST_AFTER_S. One slow answer must not move every job off a host: a job
can keep its engine busy for a moment (a flood of output), and isolating a host reschedules
everyone's jobs on it. Reconcile's pings, a follower whose stream broke and a start that failed
all ask here, so they agree.

Reconcile pings every host at once (answers): one after the other, each silent host held the
sweep for a timeout, so five of them aged a healthy host's last answer past HOST_LOST_AFTER_S
(one slow answer of its own then isolated it) and delayed every other reconcile step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from jobs.models import DockerHost

from . import engine


def host_lost(timed_out: bool, last_seen_at: datetime | None, now: datetime, lost_after_s: float) -> bool:
    """Whether a failed ping means the host is lost (a host that never answered: at once)."""
    if not timed_out or last_seen_at is None:
        return True
    return (now - last_seen_at).total_seconds() >= lost_after_s


def lost(host: DockerHost, exc: engine.EngineError) -> bool:
    """Whether this failed ping of the host means it is lost, by when it last answered (read now:
    the caller's row may be hours old)."""
    seen = DockerHost.objects.filter(id=host.id).values_list("last_seen_at", flat=True).first()
    return host_lost(isinstance(exc, engine.NoAnswerInTime), seen, timezone.now(), settings.HOST_LOST_AFTER_S)


def seen(host: DockerHost) -> None:
    DockerHost.objects.filter(id=host.id).update(last_seen_at=timezone.now())


def still_there(host: DockerHost, *, timeout: int = 5) -> bool:
    """Ping the host: it answered (and is marked seen), or it is slow but not lost yet."""
    failure = _ping(host, timeout)
    if failure is None:
        seen(host)
        return True
    return not lost(host, failure)


def _ping(host: DockerHost, timeout: int) -> engine.EngineError | None:
    """None if the host answered, else why not (its clients in this thread are dropped). A ping
    refused or broken is asked once more on a new connection before it counts: the first may have
    gone out on a kept connection that the host dropped while it was idle (an ssh:// host's are
    kept: engine_clients.py), which fails as a refusal does and would isolate a host that answers.
    A timeout is not asked again: it would double the wait."""
    for _ in range(2):
        try:
            engine.ping(host, timeout=timeout)
            return None
        except engine.HOST_ERRORS as exc:
            engine.forget_client(host)
            failure = exc
            if isinstance(exc, engine.NoAnswerInTime):
                break
    return failure


# One thread per engine, kept: the engine's clients are per thread (engine.client_for), so an
# engine keeps one connection for its pings however often reconcile asks.
_pingers: dict[str, ThreadPoolExecutor] = {}
_pingers_lock = threading.Lock()


def _pinger(host: DockerHost) -> ThreadPoolExecutor:
    with _pingers_lock:
        if host.base_url not in _pingers:
            _pingers[host.base_url] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ping-{host.name}"[:40])
        return _pingers[host.base_url]


def keep_pingers_of(hosts: Iterable[DockerHost]) -> list[str]:
    """Let the ping threads of engines no longer among `hosts` (deleted, disabled, isolated, or
    moved to another URL) end; returns their URLs. Kept, they were one idle thread per URL ever
    pinged, for the life of the worker. A ping in flight ends on its own timeout."""
    wanted = {host.base_url for host in hosts}
    with _pingers_lock:
        gone = [url for url in _pingers if url not in wanted]
        for url in gone:
            _pingers.pop(url).shutdown(wait=False, cancel_futures=True)
    return gone


def answers(hosts: Iterable[DockerHost], *, timeout: int) -> dict[int, engine.EngineError | None]:
    """Ping every host at once; per host id, None if it answered, else why not. Each wait is
    bounded: a ping that outlives its own timeout (an ssh client that hangs) counts as no answer."""
    asked = {host.id: _pinger(host).submit(_ping, host, timeout) for host in hosts}
    found: dict[int, engine.EngineError | None] = {}
    for host_id, answer in asked.items():
        try:
            found[host_id] = answer.result(timeout=timeout + 5)
        except FutureTimeout:
            found[host_id] = engine.NoAnswerInTime(f"no answer to a ping within {timeout + 5} s")
    return found
