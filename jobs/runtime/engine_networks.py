"""The engine's networks and volumes: a multi-instance job's own networks, and what a job's end
removes by label.

Part of the engine's edge (jobs/runtime/engine.py), like engine_exec.py: it calls the SDK only
through the clients engine hands out and turns its errors into the console's with `engine._edge`,
so it does not import the SDK itself (tests/test_architecture.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from .engine import EngineError, NotFound, _at_edge, _edge, client_for

INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"


@_at_edge
def ensure_internal_network(host, name: str, labels: dict[str, str]) -> str:
    """The id of the network of this name, made unless it is there: internal (no route out) and
    without an address of the host on its bridge (inhibit_ipv4), so that neither the host's
    loopback nor any of its addresses is reachable. A network of that name that is not so is
    refused (EngineError). The engine's check of a name is not atomic: two calls at once may each
    make one, and a container's create then refuses the name; callers take a lock
    (docker_hosts.making_networks)."""
    client = client_for(host)
    if not _named(client, name):
        try:
            with _edge():
                client.networks.create(
                    name,
                    driver="bridge",
                    internal=True,
                    options={INHIBIT_IPV4: "true"},
                    labels=labels,
                    check_duplicate=True,
                )
        except EngineError as exc:
            if exc.status_code != 409:  # made meanwhile (by a console without the lock)
                raise
    network = _named(client, name)[0]
    options = network.attrs.get("Options") or {}
    if not network.attrs.get("Internal") or options.get(INHIBIT_IPV4) != "true":
        raise EngineError(f"network {name} exists on this host but is not an internal network without a host address")
    return network.id


def _named(client, name: str) -> list:
    """The networks of exactly this name (the engine's name filter matches parts of names)."""
    return [n for n in client.networks.list(names=[name]) if n.name == name]


@dataclass(frozen=True)
class Labelled:
    """A network or volume of the engine, as the console finds what it made by label."""

    name: str
    labels: dict[str, str]
    created: datetime | None  # None where the engine gave no readable time


def _engine_time(value) -> datetime | None:
    """The engine's RFC 3339 time (nanoseconds, `Z` or an offset), to the microsecond."""
    text = str(value or "")
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    micro = (fraction or ".0")[1:7].ljust(6, "0")
    try:
        when = datetime.fromisoformat(f"{whole}.{micro}{'+00:00' if zone == 'Z' else zone}")
    except ValueError:
        return None
    # The engine's zero time (0001-01-01: a volume whose creation time it could not read) is no time.
    return when if when.year >= 2000 else None


@_at_edge
def networks_labelled(host, labels: str | list[str]) -> list[Labelled]:
    """The networks with these labels (`key=value`)."""
    return [
        Labelled(n.name, n.attrs.get("Labels") or {}, _engine_time(n.attrs.get("Created")))
        for n in client_for(host).networks.list(filters={"label": labels})
    ]


@_at_edge
def volumes_labelled(host, labels: str | list[str]) -> list[Labelled]:
    """The volumes with these labels (`key=value`)."""
    return [
        Labelled(v.name, v.attrs.get("Labels") or {}, _engine_time(v.attrs.get("CreatedAt")))
        for v in client_for(host).volumes.list(filters={"label": labels})
    ]


def remove_volume_unless_used(host, name: str) -> bool:
    """Remove a volume unless a container (running or not) has it (409) or it is gone already;
    whether it was removed."""
    return _removed_unless_refused(lambda: client_for(host).api.remove_volume(name), refused=(409,))


def remove_network_unless_used(host, name: str) -> bool:
    """Remove a network unless a running container is on it (403 or 409, "has active endpoints")
    or it is gone already; whether it was removed."""
    return _removed_unless_refused(lambda: client_for(host).api.remove_network(name), refused=(403, 409))


@_at_edge
def _removed_unless_refused(remove, refused: tuple[int, ...]) -> bool:
    try:
        with _edge():
            remove()
    except NotFound:
        return False
    except EngineError as exc:
        if exc.status_code in refused:
            return False
        raise
    return True


@_at_edge
def remove_labelled_volumes_and_networks(host, label: str) -> None:
    """Remove the volumes and networks with this label (`key=value`)."""
    client = client_for(host)
    for volume in client.volumes.list(filters={"label": label}):
        volume.remove(force=True)
    for network in client.networks.list(filters={"label": label}):
        network.remove()
