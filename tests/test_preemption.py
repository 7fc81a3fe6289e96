"""Preemption on dedicated pools (SPEC §3 "preemptible", §4 class "preempted").

The choice of victims is tested on model objects alone; the rest against the real
worker and Docker. The pool "pre" has 2-CPU nodes that are the local engine
registered under several names; every job asks for a whole node (2 CPUs).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings as django_settings

from faulttolerance.classify import PREEMPTED
from jobs.capacity import HostCapacity, Resources
from jobs.models import Attempt, DockerHost, EventKind, Flavor, Phase, ResourcePool, TrainingJob
from jobs.runtime import preemption, stop
from jobs.runtime.placement import Request
from jobs.runtime.preemption import Candidate, choose_victims, may_preempt
from tests.helpers import reload, submit_job, wait_for
from tests.permission_cast import grant

# -- choosing the victims, on model objects ------------------------------------------------------
NODE = Resources(cpus=8, memory_gb=64, gpus=8)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def gpus(n: int) -> Resources:
    return Resources(cpus=n, memory_gb=8 * n, gpus=n)


def hosts(*used_by: list[Candidate]) -> list[HostCapacity]:
    """One 8-GPU node per argument, holding what the candidates placed on it hold."""
    out = []
    for host_id, on_host in enumerate(used_by, start=1):
        used, count = Resources(), 0
        for candidate in on_host:
            for where, need in candidate.instances:
                if where == host_id:
                    used, count = used + need, count + 1
        out.append(HostCapacity(DockerHost(id=host_id, name=f"n{host_id}"), NODE, used, count))
    return out


def job(attempt_id: int, priority: int, started_min: int, *instances: tuple[int, int]) -> Candidate:
    """A candidate whose attempt started `started_min` minutes after T0, with (host, GPUs) instances."""
    return Candidate(
        attempt_id,
        f"j{attempt_id}",
        priority,
        T0 + timedelta(minutes=started_min),
        tuple((host, gpus(n)) for host, n in instances),
    )


def chosen(request: Request, capacities: list[HostCapacity], candidates: list[Candidate]) -> list[str]:
    return sorted(c.job_name for c in choose_victims(request, capacities, candidates))


def test_the_fewest_jobs_are_preempted_even_of_a_higher_priority():
    small_a, small_b = job(1, 1, 0, (1, 4)), job(2, 1, 0, (1, 4))
    big = job(3, 2, 0, (2, 8))
    capacities = hosts([small_a, small_b], [big])
    assert chosen(Request(1, gpus(8), "pool p"), capacities, [small_a, small_b, big]) == ["j3"]


def test_lowest_priority_then_youngest_is_preempted_first():
    old_low, young_low, mid = job(1, 1, 0, (1, 8)), job(2, 1, 30, (2, 8)), job(3, 2, 60, (3, 8))
    capacities = hosts([old_low], [young_low], [mid])
    need = Request(1, gpus(8), "pool p")
    assert chosen(need, capacities, [old_low, young_low, mid]) == ["j2"]  # the youngest of priority 1
    assert chosen(need, capacities, [old_low, mid]) == ["j1"]  # priority 1 before a younger priority 2
    # Two are needed: the pair whose most valuable member is least valuable (both priority 1).
    assert chosen(Request(2, gpus(8), "pool p"), capacities, [old_low, young_low, mid]) == ["j1", "j2"]


def test_no_victims_when_stopping_every_candidate_would_not_make_room():
    small = job(1, 1, 0, (1, 2))
    capacities = hosts([small])
    capacities[0].used = capacities[0].used + gpus(5)  # a non-preemptible job holds 5 more GPUs
    assert choose_victims(Request(1, gpus(4), "pool p"), capacities, [small]) == []
    assert choose_victims(Request(1, gpus(4), "pool p"), capacities, []) == []


def test_no_one_is_preempted_when_the_room_was_freed_meanwhile():
    # The placement read node 2 full; by the time the victims are chosen its job has ended (a full
    # run once preempted a second job this way, for room the first one's stop had already freed).
    gone, old = job(1, 1, 30, (2, 8)), job(2, 1, 0, (1, 8))
    capacities = hosts([old], [])
    assert choose_victims(Request(1, gpus(8), "pool p"), capacities, [old]) == []
    assert chosen(Request(1, gpus(8), "pool p"), hosts([old], [gone]), [old, gone]) == ["j1"]


def test_a_multi_instance_victim_frees_every_node_it_holds():
    spread = job(1, 1, 0, (1, 4), (2, 4))
    other = job(2, 1, 10, (1, 4))
    capacities = hosts([spread, other], [spread])
    # Two instances of 8 GPUs: both nodes emptied; `spread` is on both, `other` on one.
    assert chosen(Request(2, gpus(8), "pool p"), capacities, [spread, other]) == ["j1", "j2"]
    # One instance of 6 GPUs: stopping `spread` empties node 2; stopping `other` leaves 4 free on each.
    assert chosen(Request(1, gpus(6), "pool p"), capacities, [spread, other]) == ["j1"]


def test_beyond_the_exact_search_the_greedy_choice_gives_back_what_it_does_not_need(monkeypatch):
    monkeypatch.setattr(preemption, "MAX_SETS", 1)
    small_a, small_b, big = job(1, 1, 0, (1, 4)), job(2, 1, 5, (1, 4)), job(3, 2, 0, (2, 8))
    # Greedy goes in preference order (priority 1, youngest first) until the job fits: not the fewest.
    assert chosen(Request(1, gpus(8), "pool p"), hosts([small_a, small_b], [big]), [small_a, small_b, big]) == [
        "j1",
        "j2",
    ]
    # The young one frees too little on its own; once the old one is taken it is not needed: given back.
    young, old = job(1, 1, 10, (1, 2)), job(2, 1, 0, (2, 8))
    capacities = hosts([young], [old])
    capacities[0].used = capacities[0].used + gpus(6)  # a non-preemptible job beside the young one
    assert chosen(Request(1, gpus(8), "pool p"), capacities, [young, old]) == ["j2"]


def test_only_running_preemptible_lower_priority_jobs_of_the_same_pool_may_be_preempted():
    waiting = TrainingJob(name="w", pool_type="dedicated", pool_id=1, priority=3)

    def attempt(state=Attempt.State.RUNNING, preempted_at=None, **fields) -> Attempt:
        defaults = dict(name="v", pool_type="dedicated", pool_id=1, priority=1, preemptible=True, phase=Phase.RUNNING)
        return Attempt(job=TrainingJob(**(defaults | fields)), state=state, preempted_at=preempted_at)

    assert may_preempt(waiting, attempt())
    assert not may_preempt(waiting, attempt(preemptible=False))
    assert not may_preempt(waiting, attempt(pool_id=2))
    assert not may_preempt(waiting, attempt(pool_type="public", pool_id=None))
    assert not may_preempt(waiting, attempt(priority=3))  # equal
    assert may_preempt(waiting, attempt(priority=2))
    assert not may_preempt(TrainingJob(pool_type="dedicated", pool_id=1, priority=2), attempt(priority=2))
    assert not may_preempt(waiting, attempt(terminate_requested=True, phase=Phase.TERMINATING))
    assert not may_preempt(waiting, attempt(terminate_requested=True))
    assert not may_preempt(waiting, attempt(phase=Phase.RESTARTING))
    assert not may_preempt(waiting, attempt(state=Attempt.State.STARTING))
    assert not may_preempt(waiting, attempt(state=Attempt.State.ENDED))
    assert not may_preempt(waiting, attempt(preempted_at=T0))  # already being preempted


# -- against the real worker and Docker -------------------------------------------------------------
class Pool:
    """The dedicated pool "pre", its flavor of a whole node, and the owner allowed priority 3."""

    def __init__(self, demo):
        self.demo = demo
        self.pool = ResourcePool.objects.create(
            name="pre", kind="dedicated", node_cpus=2, node_memory_gb=4, check_root_gb=0.5, check_cache_gb=0.5
        )
        self.node = Flavor.objects.create(name="cpu.2u", cpus=2, memory_mb=256)
        self.high_owner = grant(demo.owner, "use_high_priority")

    def add_node(self, name: str, pool: ResourcePool | None = None) -> DockerHost:
        return DockerHost.objects.create(name=name, base_url=django_settings.DEFAULT_DOCKER_URL, pool=pool or self.pool)

    def job(self, name: str, priority: int, preemptible: bool = False, **fields) -> TrainingJob:
        defaults = dict(
            name=name,
            pool_type="dedicated",
            pool=self.pool,
            flavor=self.node,
            priority=priority,
            preemptible=preemptible,
            created_by=self.high_owner,
            command="sleep 600",
        )
        return submit_job(self.demo, **(defaults | fields))


@pytest.fixture
def pre(demo) -> Pool:
    return Pool(demo)


def running(job: TrainingJob) -> bool:
    return reload(job).phase == Phase.RUNNING


def hosts_of(job: TrainingJob) -> list[str]:
    attempt = job.attempts.order_by("-number").first()
    return [r.host.name for r in attempt.task_runs.select_related("host").order_by("index")]


def preempted(job: TrainingJob) -> bool:
    return job.events.filter(kind=EventKind.PREEMPTED).exists()


def _whereabouts(*jobs: TrainingJob) -> str:
    """Hosts and, per job, each attempt's hosts, states and events: what a failure needs to be read."""
    lines = [
        f"host {h.name}: enabled={h.enabled} isolated={h.isolated} {h.isolation_reason}"
        for h in DockerHost.objects.all()
    ]
    for job in jobs:
        job.refresh_from_db()
        lines.append(f"{job.name}: {job.phase} {job.phase_reason!r}")
        for attempt in job.attempts.order_by("number"):
            runs = [(r.host.name, r.state, r.exit_code) for r in attempt.task_runs.select_related("host")]
            lines.append(
                f"  attempt {attempt.number} {attempt.state} {attempt.outcome} preempted={attempt.preempted_at} {runs}"
            )
        lines += [f"  {e.at:%H:%M:%S.%f} {e.kind}: {e.message}" for e in job.events.order_by("id")]
    return "\n".join(lines)


@pytest.mark.django_db(transaction=True)
def test_a_higher_priority_job_preempts_the_youngest_preemptible_one_which_runs_again_later(pre, worker):
    pre.add_node("node-a")
    pre.add_node("node-b")
    old = pre.job("old", 1, preemptible=True)
    wait_for(lambda: running(old), message="the old job running")
    young = pre.job("young", 1, preemptible=True, fault_tolerance=True, max_restarts=2)
    wait_for(lambda: running(young), message="the young job running")
    assert not young.attempts.get().preempted_at

    high = pre.job("high", 3)
    wait_for(lambda: running(high), timeout=40, message="the high-priority job running")
    wait_for(lambda: reload(young).phase == Phase.PENDING and preempted(young), message="the young job re-queued")
    # One node was enough: the youngest went. Should old go too, say where everything was (a full
    # run once preempted old for room young's end had freed between two reads of the hosts).
    assert running(old) and not preempted(old), _whereabouts(old, young, high)
    event = young.events.get(kind=EventKind.PREEMPTED)
    assert "Preempted by high (priority 3), which needed the room on pool pre" in event.message
    assert event.data["preempted_by_id"] == str(high.id)
    first = young.attempts.get()
    assert (first.outcome, first.preempted_by_id) == (Attempt.Outcome.PREEMPTED, high.id)
    assert young.restarts_used == 0  # the restart budget is untouched
    record = young.recoveries.get()
    assert (record.failure_class, record.restart, record.level) == (PREEMPTED, True, "job")
    assert (record.restarts_used_after, record.max_restarts) == (0, 2)
    assert "Preempted by high" in young.phase_reason or "Waiting for capacity" in young.phase_reason
    # It waits with its own priority: high is not preemptible and old has the same priority.
    wait_for(lambda: "Waiting for capacity" in reload(young).phase_reason, message="the young job's Pending reason")
    assert young.phase_reason == "Waiting for capacity: no host of pool pre has 2 free CPUs."
    assert [j.phase for j in (old, high)] == [Phase.RUNNING, Phase.RUNNING]

    stop.request_terminate(high.id)
    wait_for(lambda: running(young), timeout=40, message="the young job running again")
    second = young.attempts.get(number=2)
    assert second.level == "job" and second.preempted_at is None
    assert young.restarts_used == 0
    record.refresh_from_db()
    assert record.next_attempt_id == second.id and record.running_again_at is not None
    assert young.events.filter(kind=EventKind.RESTARTED).exists()
    assert reload(high).phase == Phase.TERMINATED and running(old)


@pytest.mark.django_db(transaction=True)
def test_non_preemptible_equal_priority_and_other_pools_jobs_are_never_preempted(pre, worker):
    pre.add_node("node-a")
    pre.add_node("node-b")
    other_pool = ResourcePool.objects.create(
        name="other", kind="dedicated", node_cpus=2, node_memory_gb=4, check_root_gb=0.5, check_cache_gb=0.5
    )
    pre.add_node("other-a", pool=other_pool)
    keep = pre.job("keep", 1)  # not preemptible
    peer = pre.job("peer", 2, preemptible=True)
    elsewhere = pre.job("elsewhere", 1, preemptible=True, pool=other_pool)
    wait_for(lambda: running(keep) and running(peer) and running(elsewhere), message="three jobs running")
    peer_node = hosts_of(peer)  # node-a or node-b: peer (priority 2) may be placed before keep

    # Priority 2 may not preempt priority 2, nor a job that is not preemptible.
    equal = pre.job("equal", 2)
    wait_for(lambda: "Waiting for capacity" in reload(equal).phase_reason, message="the equal job's Pending reason")
    assert equal.phase == Phase.PENDING
    assert equal.phase_reason == "Waiting for capacity: no host of pool pre has 2 free CPUs."
    assert not Attempt.objects.filter(preempted_at__isnull=False).exists()

    # Priority 3 goes ahead of it and takes the only preemptible lower-priority job's node.
    high = pre.job("high", 3)
    wait_for(lambda: running(high), timeout=40, message="the high-priority job running")
    wait_for(lambda: reload(peer).phase == Phase.PENDING and preempted(peer), message="the peer job re-queued")
    assert peer.restarts_used == 0 and hosts_of(high) == peer_node  # where peer ran
    assert [running(j) for j in (keep, elsewhere)] == [True, True]
    assert not preempted(keep) and not preempted(elsewhere)
    assert Attempt.objects.filter(preempted_at__isnull=False).count() == 1
    assert equal.attempts.count() == 0 and reload(equal).phase == Phase.PENDING


@pytest.mark.django_db(transaction=True)
def test_reconcile_stops_a_preempted_attempt_whose_stop_was_lost(demo, worker, docker_client):
    """The scheduler's worker died after claiming a victim and before stopping it: the reconcile
    step stops the victim's containers (and only then does supervision re-queue the job)."""
    from django.utils import timezone

    from jobs.runtime import reconcile
    from tests.helpers import submit_job, wait_for

    job = submit_job(demo, name="victim", command="sleep 120")
    attempt = wait_for(lambda: Attempt.objects.filter(job=job, state=Attempt.State.RUNNING).first())
    assert not reconcile.stop_stale_preemptions()
    Attempt.objects.filter(id=attempt.id).update(preempted_at=timezone.now() - timezone.timedelta(seconds=60))
    reconcile.stop_stale_preemptions()  # or the suite's worker's own run of the step: the stop is the test
    wait_for(
        lambda: (
            not docker_client.containers.list(
                sparse=True, filters={"label": f"console.job={job.id}", "status": "running"}
            )
        ),
        message="the victim's container to stop",
    )
    # Re-queued (it may already run again: nothing else waits for its host), its budget untouched.
    wait_for(lambda: job.events.filter(kind=EventKind.PREEMPTED).exists(), message="the victim re-queued")
    assert TrainingJob.objects.get(id=job.id).restarts_used == 0
