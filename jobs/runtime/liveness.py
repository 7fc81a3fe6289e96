"""Whether a Docker host is still there (SPEC §4: a host is isolated on a lost connection).

A refused or broken connection is a fact: the host is lost. A call that timed out is an engine
busy or hung, which one call cannot tell apart: the host is lost only once it has answered no
ping for settings.HOST_LOST_AFTER_S. One slow answer must not move every job off a host: a job
can keep its engine busy for a moment (a flood of output), and isolating a host reschedules
everyone's jobs on it. Reconcile's pings, a follower whose stream broke and a start that failed
all ask here, so they agree.
"""

from __future__ import annotations

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
    try:
        engine.ping(host, timeout=timeout)
    except engine.HOST_ERRORS as exc:
        engine.forget_client(host)
        return not lost(host, exc)
    seen(host)
    return True
