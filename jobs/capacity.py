"""Free capacity of Docker hosts and resource pools (SPEC §3 "pool", "instance count").

A host of a pool is one node of the pool's node size; what it has free is that
size minus what the instances placed on it (task runs created or running) asked
for: their flavor or custom spec. An instance of a job with neither asks for
nothing countable, so it never blocks placement, but its node is not free. A
host without a pool has no known size: it is never full (the behaviour before
capacity was counted).

The wizard's pool picker calls pool_usage for every dedicated pool, so each
call is two queries (the pool's hosts, the instances on them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.utils.translation import gettext

from jobs.models import DockerHost, ResourcePool, TaskRun, TrainingJob

# Task runs that hold a host's resources: placed (not yet started) or running.
ACTIVE_STATES = (TaskRun.State.CREATED, TaskRun.State.RUNNING)
_EPSILON = 1e-9  # float CPUs/GB: 0.1 + 0.2 must still fit in 0.3


@dataclass(frozen=True)
class Resources:
    """CPUs, memory and GPUs (or NPUs) of one node or asked for by one instance."""

    cpus: float = 0.0
    memory_gb: float = 0.0
    gpus: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpus + other.cpus, self.memory_gb + other.memory_gb, self.gpus + other.gpus)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpus - other.cpus, self.memory_gb - other.memory_gb, self.gpus - other.gpus)

    def covers(self, need: Resources) -> bool:
        """Whether `need` fits into these resources."""
        return (
            need.cpus <= self.cpus + _EPSILON and need.memory_gb <= self.memory_gb + _EPSILON and need.gpus <= self.gpus
        )

    def times_fits(self, need: Resources) -> int | None:
        """How many instances asking `need` fit in here; None: unbounded (it asks for nothing)."""
        counts = [
            int((have + _EPSILON) // want)
            for have, want in ((self.cpus, need.cpus), (self.memory_gb, need.memory_gb), (self.gpus, need.gpus))
            if want > 0
        ]
        return max(0, min(counts)) if counts else None

    def at_least_zero(self) -> Resources:
        return Resources(max(0.0, self.cpus), max(0.0, self.memory_gb), max(0, self.gpus))

    def describe(self) -> str:
        """'2 CPUs, 4 GB memory, 1 GPU': what a message or a page shows."""
        parts = [f"{_num(self.cpus)} CPU{'s' if self.cpus != 1 else ''}", f"{_num(self.memory_gb)} GB memory"]
        if self.gpus:
            parts.append(f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}")
        return ", ".join(parts)


def _num(value: float) -> str:
    return f"{round(value, 2):g}"


def node_of(pool: ResourcePool | None) -> Resources | None:
    """The size of one node of a pool; None for a host without a pool (size unknown, never full)."""
    if pool is None:
        return None
    return Resources(float(pool.node_cpus), float(pool.node_memory_gb), int(pool.node_gpus))


def _demand(
    pool_type: str,
    spec_type: str,
    custom: tuple[float | None, float | None, int | None],
    flavor: tuple[float | None, int | None, int | None],
) -> Resources | None:
    """TrainingJob.resource_limits() on plain values, so usage is one query without model objects."""
    custom_cpus, custom_memory_gb, custom_gpus = custom
    if pool_type == TrainingJob.PoolType.DEDICATED and spec_type == TrainingJob.SpecType.CUSTOM and custom_cpus:
        return Resources(float(custom_cpus), float(custom_memory_gb or 0), int(custom_gpus or 0))
    cpus, memory_mb, gpus = flavor
    if cpus is None:
        return None
    return Resources(float(cpus), (memory_mb or 0) / 1024, int(gpus or 0))


def job_demand(job: TrainingJob) -> Resources | None:
    """What each instance of the job asks for; None: neither flavor nor custom spec (no limit)."""
    limits = job.resource_limits()
    if limits is None:
        return None
    return Resources(float(limits["cpus"]), limits["memory_mb"] / 1024, int(limits["gpus"]))


@dataclass
class HostCapacity:
    """One host: its node size (None: unknown), what its instances use and how many there are."""

    host: DockerHost
    node: Resources | None
    used: Resources = field(default_factory=Resources)
    instances: int = 0

    @property
    def free(self) -> Resources | None:
        return None if self.node is None else self.node - self.used

    def fits(self, need: Resources | None) -> bool:
        if need is None or self.node is None:
            return True
        return self.node.covers(self.used + need)

    def take(self, need: Resources | None) -> None:
        """Count one more instance on this host (placement plans several at once)."""
        self.instances += 1
        if need is not None:
            self.used = self.used + need


def hosts_capacity(hosts: Iterable[DockerHost], *, exclude_job=None) -> dict[int, HostCapacity]:
    """Capacity of each host, in one query. exclude_job: a job whose instances are being
    replaced by the placement in progress (its old containers are on their way out)."""
    capacities = {h.id: HostCapacity(h, node_of(h.pool if h.pool_id else None)) for h in hosts}
    runs = TaskRun.objects.filter(host_id__in=list(capacities), state__in=ACTIVE_STATES)
    if exclude_job is not None:
        runs = runs.exclude(attempt__job_id=exclude_job)
    seen: set[tuple[int, str]] = set()
    for row in runs.values_list(
        "host_id",
        "container_name",
        "attempt__job__pool_type",
        "attempt__job__spec_type",
        "attempt__job__custom_cpus",
        "attempt__job__custom_memory_gb",
        "attempt__job__custom_gpus",
        "attempt__job__flavor__cpus",
        "attempt__job__flavor__memory_mb",
        "attempt__job__flavor__gpus",
    ):
        host_id, container = row[0], row[1]
        # A process-level restart is a second task run of the same container: count it once.
        if (host_id, container) in seen:
            continue
        seen.add((host_id, container))
        capacities[host_id].take(_demand(row[2], row[3], row[4:7], row[7:10]))
    return capacities


def host_free(host: DockerHost) -> HostCapacity:
    """A host's node size, use and free resources (`.free` is None for a host without a pool)."""
    return hosts_capacity([host])[host.id]


@dataclass(frozen=True)
class PoolUsage:
    """What the create wizard's pool picker shows for a pool (SPEC §3 "pool")."""

    pool: str
    nodes_total: int
    nodes_free: int  # nodes without any instance
    free_cpus: float
    free_memory_gb: float
    free_gpus: int
    # Share of the free GPUs (CPUs on a pool without GPUs) that sit on partly used nodes:
    # 0 = all free capacity is on empty nodes, 1 = none is; a large job needs whole nodes.
    fragmentation: float
    fragmentation_unit: str  # "GPUs" or "CPUs"

    def text(self) -> str:
        # The wizard's pool picker, in the page's language.
        parts = [gettext("%(free)s/%(total)s nodes free") % {"free": self.nodes_free, "total": self.nodes_total}]
        if self.fragmentation_unit == "GPUs":
            parts.append(gettext("%(count)s GPUs") % {"count": self.free_gpus})
        parts += [
            gettext("%(count)s CPUs") % {"count": _num(self.free_cpus)},
            f"{_num(self.free_memory_gb)} GB",
            gettext("fragmentation %(percent)s") % {"percent": f"{self.fragmentation:.0%}"},
        ]
        return " · ".join(parts)

    def __str__(self) -> str:
        return self.text()


def pool_hosts(pool: ResourcePool):
    """The hosts that count for new jobs of a pool: enabled, not isolated, not hot standby (SPEC §3, §4)."""
    return DockerHost.objects.filter(pool=pool, enabled=True, isolated=False, hot_standby=False).order_by("id")


def pool_usage(pool: ResourcePool) -> PoolUsage:
    """Free nodes, CPUs, memory and GPUs of a pool and its fragmentation (two queries)."""
    hosts = list(pool_hosts(pool))
    for host in hosts:
        host.pool = pool  # saves a query per host in hosts_capacity
    capacities = list(hosts_capacity(hosts).values())
    free = [c.free.at_least_zero() for c in capacities]  # every host here has a pool, so a size
    gpu_pool = pool.node_gpus > 0

    def unit(r: Resources) -> float:
        return r.gpus if gpu_pool else r.cpus

    free_total = sum(unit(f) for f in free)
    on_used_nodes = sum(unit(f) for c, f in zip(capacities, free, strict=True) if c.instances)
    return PoolUsage(
        pool=pool.name,
        nodes_total=len(capacities),
        nodes_free=sum(1 for c in capacities if not c.instances),
        free_cpus=round(sum(f.cpus for f in free), 2),
        free_memory_gb=round(sum(f.memory_gb for f in free), 2),
        free_gpus=sum(f.gpus for f in free),
        fragmentation=round(on_used_nodes / free_total, 4) if free_total else 0.0,
        fragmentation_unit="GPUs" if gpu_pool else "CPUs",
    )
