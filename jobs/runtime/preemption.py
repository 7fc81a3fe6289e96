"""Preemption on dedicated pools (SPEC §3 "preemptible", §4 class "preempted").

When the job at the head of a dedicated pool's queue waits for capacity, the
scheduler may stop running jobs of that pool that are preemptible and of a lower
priority, so that it fits. Which ones (`choose_victims`, a pure function):

1. the fewest jobs that make room;
2. among sets of that size, the one whose most valuable member is least
   valuable, then the next one, and so on, where a job is less valuable when
   its priority is lower and, at equal priority, when its current attempt
   started later (the youngest has the least work to lose);
3. the search is exact up to MAX_SETS sets; beyond that the jobs are taken in
   that order until the waiting job fits, and those not needed are given back.

The victims' attempts are claimed with a conditional UPDATE (`preempted_at`),
under the placement lock the caller holds, so two schedulers never preempt
for the same room twice: an attempt already claimed counts as freed until its
containers are gone. Its containers are stopped after commit (SIGTERM, then
SIGKILL after the stop timeout); when the attempt ends, decide.py re-queues
the job without touching its restart budget.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations

from django.db import transaction
from django.utils import timezone

from jobs.capacity import ACTIVE_STATES, HostCapacity, Resources, hosts_capacity, job_demand
from jobs.models import Attempt, Phase, TaskRun, TrainingJob

from . import placement
from .lifecycle import announce

log = logging.getLogger(__name__)

# Sets of victims tried one by one before falling back to the greedy choice.
MAX_SETS = 4096
# A preempted attempt whose containers still run after this long is stopped again
# (the thread that stopped them may have died).
RESTOP_AFTER_S = 20


@dataclass(frozen=True)
class Candidate:
    """A running attempt the scheduler could stop, and what its instances hold."""

    attempt_id: int
    job_name: str
    priority: int
    started_at: datetime | None
    instances: tuple[tuple[int, Resources | None], ...]  # (host id, resources) per container
    preempted_at: datetime | None = None

    def describe(self) -> str:
        return f"{self.job_name} (priority {self.priority})"


def preference(candidate: Candidate) -> tuple:
    """Sort key, first preempted first: lowest priority, then the youngest attempt."""
    started = candidate.started_at.timestamp() if candidate.started_at else math.inf  # never started: nothing to lose
    return (candidate.priority, -started, -candidate.attempt_id)


def freed(capacities: list[HostCapacity], victims: list[Candidate]) -> list[HostCapacity]:
    """The hosts as they will be once the victims' containers are gone (copies)."""
    released: dict[int, tuple[Resources, int]] = {}
    for victim in victims:
        for host_id, need in victim.instances:
            used, count = released.get(host_id, (Resources(), 0))
            released[host_id] = (used + need if need is not None else used, count + 1)
    out = []
    for c in capacities:
        used, count = released.get(c.host.id, (Resources(), 0))
        out.append(HostCapacity(c.host, c.node, (c.used - used).at_least_zero(), max(0, c.instances - count)))
    return out


def fits(request: placement.Request, capacities: list[HostCapacity], victims: list[Candidate]) -> bool:
    return placement.place(request, freed(capacities, victims)).hosts is not None


def choose_victims(
    request: placement.Request, capacities: list[HostCapacity], candidates: list[Candidate]
) -> list[Candidate]:
    """The jobs to stop so that `request` can be placed (see the module's docstring for the
    order); [] when stopping every candidate would still not make room, or when it fits
    already: the placement that found no room read the hosts a moment earlier (each statement
    sees what was committed when it ran), and an instance that ended in between freed it."""
    ordered = sorted(candidates, key=preference)
    if fits(request, capacities, []):
        return []
    if not ordered or not fits(request, capacities, ordered):
        return []
    budget = MAX_SETS
    for size in range(1, len(ordered) + 1):
        sets = math.comb(len(ordered), size)
        if sets > budget:
            break
        budget -= sets
        # combinations() yields ascending index tuples; reversed, the most valuable member comes first.
        fitting = [s for s in combinations(range(len(ordered)), size) if fits(request, capacities, _pick(ordered, s))]
        if fitting:
            return _pick(ordered, min(fitting, key=lambda s: s[::-1]))
    return _greedy(request, capacities, ordered)


def _pick(ordered: list[Candidate], indexes: tuple[int, ...]) -> list[Candidate]:
    return [ordered[i] for i in indexes]


def _greedy(request: placement.Request, capacities: list[HostCapacity], ordered: list[Candidate]) -> list[Candidate]:
    chosen: list[Candidate] = []
    for candidate in ordered:
        chosen.append(candidate)
        if fits(request, capacities, chosen):
            break
    # Give back the most valuable ones that turned out not to be needed.
    for candidate in reversed(list(chosen)):
        rest = [c for c in chosen if c is not candidate]
        if fits(request, capacities, rest):
            chosen = rest
    return chosen


# -- the database side -----------------------------------------------------------------
def _attempts_on(hosts: list, waiting: TrainingJob) -> list[tuple[Attempt, list[tuple[int, Resources | None]]]]:
    """Other jobs' attempts holding capacity on `hosts`, with the instances they hold there."""
    runs = (
        TaskRun.objects.filter(host_id__in=[h.id for h in hosts], state__in=ACTIVE_STATES)
        .exclude(attempt__job_id=waiting.id)
        .select_related("attempt__job__flavor", "attempt__job__pool")
        .order_by("attempt_id", "index")
    )
    attempts: dict[int, tuple[Attempt, list]] = {}
    seen: set[tuple[int, int, str]] = set()
    for run in runs:
        # A process-level restart is a second task run of the same container: count it once.
        if (run.attempt_id, run.host_id, run.container_name) in seen:
            continue
        seen.add((run.attempt_id, run.host_id, run.container_name))
        attempt, instances = attempts.setdefault(run.attempt_id, (run.attempt, []))
        instances.append((run.host_id, job_demand(attempt.job)))
    return list(attempts.values())


def _candidate(attempt: Attempt, instances: list) -> Candidate:
    return Candidate(
        attempt.id, attempt.job.name, attempt.job.priority, attempt.started_at, tuple(instances), attempt.preempted_at
    )


def may_preempt(waiting: TrainingJob, attempt: Attempt) -> bool:
    """SPEC §3: only running, preemptible jobs of the same dedicated pool with a lower
    priority; never one being stopped, ending, restarting or already preempted."""
    job = attempt.job
    return (
        attempt.state == Attempt.State.RUNNING
        and attempt.preempted_at is None
        and job.dedicated
        and job.pool_id == waiting.pool_id
        and job.preemptible
        and job.priority < waiting.priority
        and job.phase == Phase.RUNNING
        and not job.terminate_requested
    )


def preempt_for(waiting: TrainingJob, *, for_recovery: bool = False) -> str:
    """Make room for a Pending job of a dedicated pool that waits for capacity; call in the
    transaction (and under the placement lock) of the placement that found no room.

    Returns what the job's Pending reason adds ("Preempting x (priority 1) to make room."),
    or "" when preemption cannot help.
    """
    if not waiting.dedicated or waiting.pool_id is None:
        return ""
    hosts = placement.healthy_hosts(waiting, for_recovery=for_recovery)
    if not hosts:
        return ""
    request = placement.request_of(waiting)
    capacities = list(hosts_capacity(hosts, exclude_job=waiting.id).values())
    in_flight: list[Candidate] = []
    candidates: list[Candidate] = []
    for attempt, instances in _attempts_on(hosts, waiting):
        if attempt.preempted_at is not None:
            in_flight.append(_candidate(attempt, instances))
        elif may_preempt(waiting, attempt):
            candidates.append(_candidate(attempt, instances))
    if in_flight:
        _restop_stale(in_flight)
        if fits(request, capacities, in_flight):
            return _note(in_flight)  # room is being made already: wait for it, preempt no one else
        capacities = freed(capacities, in_flight)
    victims = choose_victims(request, capacities, candidates)
    now = timezone.now()
    # A victim whose attempt row is locked is being decided (it ended meanwhile): skip it rather
    # than wait, since its decision may wait for the placement lock this scheduler holds.
    free = set(
        Attempt.objects.select_for_update(skip_locked=True)
        .filter(id__in=[v.attempt_id for v in victims])
        .values_list("id", flat=True)
    )
    claimed = [
        v
        for v in victims
        if v.attempt_id in free
        # Conditional: a victim that ended, restarted or was stopped meanwhile is left alone.
        and Attempt.objects.filter(
            id=v.attempt_id,
            state=Attempt.State.RUNNING,
            preempted_at=None,
            job__phase=Phase.RUNNING,
            job__terminate_requested=False,
        ).update(preempted_at=now, preempted_by=waiting)
    ]
    if claimed:
        log.info("preempting %s for %s", ", ".join(v.describe() for v in claimed), waiting.name)
        ids = [v.attempt_id for v in claimed]
        by = f"{waiting.name} (priority {waiting.priority})"
        transaction.on_commit(lambda: stop_preempted(ids, by))
    return _note(in_flight + claimed)


def _note(victims: list[Candidate]) -> str:
    if not victims:
        return ""
    return f"Preempting {', '.join(v.describe() for v in sorted(victims, key=preference))} to make room."


def _restop_stale(in_flight: list[Candidate]) -> None:
    cutoff = timezone.now() - timezone.timedelta(seconds=RESTOP_AFTER_S)
    stale = [v.attempt_id for v in in_flight if v.preempted_at is not None and v.preempted_at < cutoff]
    if stale:
        transaction.on_commit(lambda: stop_preempted(stale, ""))


def stop_preempted(attempt_ids: list[int], by: str) -> None:
    """After commit: say so on the victims' pages, then docker stop their containers (the
    launcher forwards SIGTERM; SIGKILL after the stop timeout). Their followers record the
    exits and decide.py re-queues each job once all its containers are gone."""
    from .stop import stop_attempt_containers  # stop imports schedule, which imports this module

    for attempt_id in attempt_ids:
        if by:
            job_id = Attempt.objects.filter(id=attempt_id).values_list("job_id", flat=True).first()
            # A plain UPDATE outside any transaction: no lock is held while it waits for the row.
            if TrainingJob.objects.filter(id=job_id, phase=Phase.RUNNING, terminate_requested=False).update(
                phase_reason=f"Preempted by {by}: stopping its instances to make room."
            ):
                announce(job_id)
        try:
            stop_attempt_containers(attempt_id)
        except Exception:  # the next scheduling pass stops it again (RESTOP_AFTER_S)
            log.exception("stopping preempted attempt %s failed", attempt_id)
