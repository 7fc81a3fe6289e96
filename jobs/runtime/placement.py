"""Where a job's instances go: pool, capacity and affinity (SPEC §3 "resource").

`place` is a pure function of the request and the hosts' capacities (a unit test
needs no database); `place_job` gathers both for a job and serialises
placements, so two jobs never both take the last free capacity of a host.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models import Q

from jobs.capacity import HostCapacity, Resources, hosts_capacity, job_demand
from jobs.models import DockerHost, ResourcePool, TrainingJob

# pg_advisory_xact_lock key of "placing instances" (any constant unique to this purpose).
PLACEMENT_LOCK = 0x706C6163


@dataclass(frozen=True)
class Request:
    """What a job asks of the scheduler."""

    count: int
    need: Resources | None  # per instance; None: no flavor nor custom spec (fits anywhere)
    scope: str  # how messages name the hosts: "pool gpu-a", "the public pools"
    affinity: str = ""  # "", "affinity" or "anti_affinity"
    required: bool = True  # strong (required) or weak (preferred) affinity
    affinity_hosts: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Placement:
    hosts: list[DockerHost] | None  # one per instance; None: it cannot be placed now
    reason: str = ""
    # It would fit on the eligible hosts were they empty: it waits for capacity, and
    # jobs queued behind it wait too (strict priority order, no backfill).
    waiting_for_capacity: bool = False


def place(request: Request, capacities: list[HostCapacity]) -> Placement:
    """Choose a host for each instance, or say why none can be chosen.

    Strong affinity keeps only the listed hosts, strong anti-affinity drops them;
    weak ones only order the choice. Among the hosts that still fit an instance,
    the preferred ones come first, hot-standby hosts last, then the least loaded
    (instances spread round robin, as before capacity was counted).
    """
    listed = request.affinity_hosts
    candidates = list(capacities)
    if not candidates:
        return Placement(None, f"No healthy host in {request.scope}.")
    if request.affinity and request.required:
        keep = request.affinity == TrainingJob.Affinity.AFFINITY
        candidates = [c for c in candidates if (c.host.name in listed) == keep]
        if not candidates:
            names = ", ".join(sorted(listed))
            if keep:
                return Placement(None, f"No healthy host of {request.scope} is among the affinity hosts ({names}).")
            return Placement(None, f"Every healthy host of {request.scope} is excluded by anti-affinity ({names}).")

    def avoided(c: HostCapacity) -> bool:
        if not request.affinity or request.required:
            return False
        return (c.host.name in listed) != (request.affinity == TrainingJob.Affinity.AFFINITY)

    # A copy to plan on: the callers' capacities stay as measured.
    plan = {c.host.id: HostCapacity(c.host, c.node, c.used, c.instances) for c in candidates}
    chosen: list[DockerHost] = []
    for _ in range(request.count):
        fitting = [c for c in plan.values() if c.fits(request.need)]
        if not fitting:
            break
        best = min(fitting, key=lambda c: (avoided(c), c.host.hot_standby, c.instances, c.host.id))
        best.take(request.need)
        chosen.append(best.host)
    if len(chosen) == request.count:
        return Placement(chosen)
    return _shortage(request, candidates, len(chosen))


def _shortage(request: Request, candidates: list[HostCapacity], placed: int) -> Placement:
    # Only reached with a need and sized hosts: an instance asking for nothing, or a
    # host without a size, always fits.
    need = request.need
    on_empty = [request.count if (n := c.node.times_fits(need)) is None else n for c in candidates]
    if sum(on_empty) >= request.count:
        if placed:
            reason = (
                f"Waiting for capacity: only {placed} of {request.count} instances "
                f"({need.describe()} each) fit on the free capacity of {request.scope}."
            )
        else:
            reason = f"Waiting for capacity: {_missing(request, candidates)}."
        return Placement(None, reason, waiting_for_capacity=True)
    if not any(on_empty):
        largest = max((c.node for c in candidates), key=lambda r: (r.gpus, r.cpus, r.memory_gb))
        reason = (
            f"No host of {request.scope} is large enough for one instance ({need.describe()}; "
            f"a node has {largest.describe()})."
        )
    else:
        reason = (
            f"{request.count} instances of {need.describe()} need more hosts than {request.scope} has: "
            f"{sum(on_empty)} fit on its hosts even when they are empty."
        )
    return Placement(None, reason)


def _missing(request: Request, candidates: list[HostCapacity]) -> str:
    """'no host of pool X has 4 free GPUs': the resources no single host has free."""
    need = request.need
    free = [c.free for c in candidates]
    short = []
    if need.gpus and not any(f.gpus >= need.gpus for f in free):
        short.append(f"{need.gpus} free GPU{'s' if need.gpus != 1 else ''}")
    if need.cpus and not any(f.cpus + 1e-9 >= need.cpus for f in free):
        short.append(f"{need.cpus:g} free CPU{'s' if need.cpus != 1 else ''}")
    if need.memory_gb and not any(f.memory_gb + 1e-9 >= need.memory_gb for f in free):
        short.append(f"{round(need.memory_gb, 2):g} GB of free memory")
    if short:
        return f"no host of {request.scope} has {' and '.join(short)}"
    return f"no host of {request.scope} has {need.describe()} free at once"


# -- the database side -----------------------------------------------------------------
def scope_hosts(job: TrainingJob):
    """Hosts a job may use: those of its dedicated pool, or of the public pools and hosts without a pool."""
    hosts = DockerHost.objects.select_related("pool").order_by("id")
    if job.dedicated:
        return hosts.filter(pool_id=job.pool_id)
    return hosts.filter(Q(pool__isnull=True) | Q(pool__kind=ResourcePool.Kind.PUBLIC))


def scope_name(job: TrainingJob) -> str:
    if job.dedicated:
        return f"pool {job.pool.name}" if job.pool_id else "the job's dedicated pool"
    return "the public pools"


def healthy_hosts(job: TrainingJob, *, for_recovery: bool = False, avoid: set[int] = frozenset()) -> list[DockerHost]:
    hosts = scope_hosts(job).filter(enabled=True, isolated=False).exclude(id__in=avoid)
    if not for_recovery:
        hosts = hosts.filter(hot_standby=False)  # hot-standby hosts only take over failed work
    return list(hosts)


def no_host_reason(job: TrainingJob) -> str:
    isolated = list(scope_hosts(job).filter(isolated=True).values_list("name", "isolation_reason"))
    detail = "; ".join(f"{name} isolated: {reason}" for name, reason in isolated)
    # Whole sentences, each a template of jobs/stored_texts.py (a page shows them translated).
    if job.dedicated:
        scope = scope_name(job)
        if detail:
            return f"Waiting for a healthy Docker host of {scope} ({detail})"
        return f"Waiting for a healthy Docker host of {scope}: none is enabled."
    return (
        f"Waiting for a healthy Docker host ({detail})"
        if detail
        else "Waiting for a healthy Docker host: none is enabled."
    )


def request_of(job: TrainingJob, count: int | None = None) -> Request:
    return Request(
        count=job.node_count if count is None else count,
        need=job_demand(job),
        scope=scope_name(job),
        affinity=job.affinity or "",
        required=job.affinity_strength != TrainingJob.AffinityStrength.PREFERRED,
        affinity_hosts=frozenset(h for h in job.affinity_hosts or [] if isinstance(h, str)),
    )


def lock_placements() -> None:
    """Serialise placements until the transaction ends: the capacity a placement reads
    must still be free when its task runs are written. Take it after the job's row lock
    (every caller does), never before: one order, no deadlock. SQLite serialises writers."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PLACEMENT_LOCK])


def place_job(
    job: TrainingJob,
    count: int | None = None,
    *,
    for_recovery: bool = False,
    avoid: set[int] = frozenset(),
    replacing: bool = True,
) -> Placement:
    """Place `count` (default: all) instances of a job; call inside a transaction.

    replacing: the job's own instances still on the hosts are on their way out (a new
    whole attempt) and do not count; False when only some instances move (rescheduling).
    """
    lock_placements()
    hosts = healthy_hosts(job, for_recovery=for_recovery, avoid=avoid)
    if not hosts:
        return Placement(None, no_host_reason(job))
    capacities = hosts_capacity(hosts, exclude_job=job.id if replacing else None)
    return place(request_of(job, count), list(capacities.values()))
