"""The engine's networks and volumes: a multi-instance job's own networks, and what a job's end
removes by label.

Part of the engine's edge (jobs/runtime/engine.py), like engine_exec.py: it calls the SDK only
through the clients engine hands out and turns its errors into the console's with `engine._edge`,
so it does not import the SDK itself (tests/test_architecture.py).
"""

from __future__ import annotations

from .engine import EngineError, NotFound, _at_edge, _edge, client_for

INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"


@_at_edge
def ensure_internal_network(host, name: str, labels: dict[str, str]) -> str:
    """The id of the network of this name, made unless it is there: internal (no route out) and
    without an address of the host on its bridge (inhibit_ipv4), so that neither the host's
    loopback nor any of its addresses is reachable. A network of that name that is not so is
    refused (EngineError). A container joins it by this id: two starts of one attempt (a retried
    start) may each have made one, the engine's check of the name is not atomic, and a name that
    two networks have is refused at the container's create."""
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
            if exc.status_code != 409:  # another start made it meanwhile (and the engine saw it)
                raise
    # The first made is the one: whoever looks after its own create sees it (it was made before),
    # so every start picks the same. The others are not in use by anyone: removed.
    first, *others = sorted(_named(client, name), key=_made_at)
    for other in others:
        try:
            with _edge():
                other.remove()
        except EngineError:
            pass  # the job's end removes it (by label)
    options = first.attrs.get("Options") or {}
    if not first.attrs.get("Internal") or options.get(INHIBIT_IPV4) != "true":
        raise EngineError(f"network {name} exists on this host but is not an internal network without a host address")
    return first.id


def _named(client, name: str) -> list:
    """The networks of exactly this name (the engine's name filter matches parts of names)."""
    return [n for n in client.networks.list(names=[name]) if n.name == name]


def _made_at(network) -> tuple[str, str, str]:
    """When the engine made it, comparable: RFC 3339 with the nanoseconds' trailing zeros cut."""
    created = network.attrs.get("Created") or ""
    seconds, _, rest = created.partition(".")
    fraction = rest[: len(rest) - len(rest.lstrip("0123456789"))]  # before the zone
    return seconds, fraction.ljust(9, "0"), network.id


@_at_edge
def networks_labelled(host, label: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of the networks with this label (`key=value`)."""
    return [(n.name, n.attrs.get("Labels") or {}) for n in client_for(host).networks.list(filters={"label": label})]


@_at_edge
def remove_network_unless_used(host, name: str) -> bool:
    """Remove a network unless a running container is on it (the engine refuses: 403) or it is
    gone already; whether it was removed."""
    try:
        with _edge():
            client_for(host).api.remove_network(name)
    except NotFound:
        return False
    except EngineError as exc:
        if exc.status_code in (403, 409):  # "has active endpoints"
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
