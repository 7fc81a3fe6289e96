"""Scheduling by pool, capacity, affinity and priority; auto stop and retention (SPEC §3).

The placement function is tested on model objects alone; the rest against the real
worker and Docker. The dedicated pool's hosts "node-a"/"node-b" are the local engine
registered twice (two nodes to the scheduler); affinity uses a second engine.
"""

from __future__ import annotations

import docker
import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from jobs.capacity import HostCapacity, Resources, host_free, pool_usage
from jobs.models import (
    Attempt,
    DockerHost,
    EventKind,
    Flavor,
    Phase,
    ResourcePool,
    TaskRun,
    TrainingJob,
    Workspace,
)
from jobs.runtime import reconcile, stop
from jobs.runtime.placement import Request, place
from tests.helpers import ended, reload, submit_job, wait_for

# -- the placement function, on model objects ---------------------------------------------
GPU_NODE = Resources(cpus=64, memory_gb=512, gpus=8)


def node(host_id: int, name: str, used: Resources | None = None, instances: int = 0, **fields) -> HostCapacity:
    return HostCapacity(DockerHost(id=host_id, name=name, **fields), GPU_NODE, used or Resources(), instances)


def gpus(n: int) -> Resources:
    return Resources(cpus=4 * n, memory_gb=32 * n, gpus=n)


def names(placement) -> list[str]:
    return [h.name for h in placement.hosts]


def test_instances_spread_over_the_least_loaded_hosts_that_fit():
    hosts = [node(1, "a", gpus(2), 1), node(2, "b"), node(3, "c", gpus(7), 1)]
    placement = place(Request(3, gpus(2), "pool p"), hosts)
    # c has 1 GPU free: never; b is empty: first; then a and b in turn.
    assert names(placement) == ["b", "a", "b"]
    assert hosts[1].instances == 0  # the caller's measurements are not changed


def test_a_job_that_does_not_fit_says_which_resource_no_host_has():
    hosts = [node(1, "a", gpus(6), 2), node(2, "b", gpus(5), 1)]
    placement = place(Request(1, gpus(4), "pool p"), hosts)
    assert placement.hosts is None and placement.waiting_for_capacity
    assert placement.reason == "Waiting for capacity: no host of pool p has 4 free GPUs."
    # Every resource on its own is free somewhere, but not together on one host.
    mixed = [node(1, "a", Resources(60, 0, 0)), node(2, "b", Resources(0, 0, 6))]
    assert "has 16 CPUs, 128 GB memory, 4 GPUs free at once" in place(Request(1, gpus(4), "pool p"), mixed).reason


def test_some_instances_fit_and_some_do_not():
    placement = place(Request(4, gpus(4), "pool p"), [node(1, "a", gpus(4), 1), node(2, "b")])
    assert placement.hosts is None and placement.waiting_for_capacity  # 4 would fit on the empty nodes
    assert "only 3 of 4 instances (16 CPUs, 128 GB memory, 4 GPUs each) fit" in placement.reason


def test_a_job_larger_than_the_pool_does_not_wait_for_capacity():
    too_big = place(Request(1, gpus(9), "pool p"), [node(1, "a")])
    assert not too_big.waiting_for_capacity
    assert too_big.reason.startswith("No host of pool p is large enough for one instance (36 CPUs, 288 GB memory")
    too_many = place(Request(3, gpus(8), "pool p"), [node(1, "a"), node(2, "b")])
    assert not too_many.waiting_for_capacity and "2 fit on its hosts even when they are empty" in too_many.reason


def test_an_instance_without_a_spec_or_a_host_without_a_size_always_fits():
    full = node(1, "a", GPU_NODE, 3)
    assert names(place(Request(2, None, "pool p"), [full])) == ["a", "a"]
    unsized = HostCapacity(DockerHost(id=2, name="b"), None, Resources(), 0)
    assert names(place(Request(2, gpus(8), "pool p"), [full, unsized])) == ["b", "b"]


def test_strong_affinity_and_anti_affinity_keep_or_drop_the_listed_hosts():
    hosts = [node(1, "a"), node(2, "b", gpus(1), 1), node(3, "c")]
    only_b = Request(2, gpus(1), "pool p", affinity="affinity", affinity_hosts=frozenset({"b"}))
    assert names(place(only_b, hosts)) == ["b", "b"]
    not_a_b = Request(2, gpus(1), "pool p", affinity="anti_affinity", affinity_hosts=frozenset({"a", "b"}))
    assert names(place(not_a_b, hosts)) == ["c", "c"]
    full_b = [node(1, "a"), node(2, "b", Resources(gpus=8), 1)]
    waits = place(Request(1, gpus(1), "pool p", affinity="affinity", affinity_hosts=frozenset({"b"})), full_b)
    assert waits.hosts is None and waits.reason == "Waiting for capacity: no host of pool p has 1 free GPU."
    gone = place(Request(1, gpus(1), "pool p", affinity="affinity", affinity_hosts=frozenset({"z"})), hosts)
    assert gone.reason == "No healthy host of pool p is among the affinity hosts (z)."
    everything = Request(1, None, "pool p", affinity="anti_affinity", affinity_hosts=frozenset({"a", "b", "c"}))
    assert place(everything, hosts).reason == "Every healthy host of pool p is excluded by anti-affinity (a, b, c)."


def test_weak_affinity_prefers_and_falls_back():
    hosts = [node(1, "a"), node(2, "b", gpus(6), 3)]
    prefer_b = Request(2, gpus(1), "pool p", affinity="affinity", required=False, affinity_hosts=frozenset({"b"}))
    assert names(place(prefer_b, hosts)) == ["b", "b"]  # preferred although more loaded
    prefer_b_big = Request(2, gpus(2), "pool p", affinity="affinity", required=False, affinity_hosts=frozenset({"b"}))
    assert names(place(prefer_b_big, hosts)) == ["b", "a"]  # b is full after one: fall back
    avoid_a = Request(1, gpus(1), "pool p", affinity="anti_affinity", required=False, affinity_hosts=frozenset({"a"}))
    assert names(place(avoid_a, hosts)) == ["b"]
    avoid_all = Request(1, gpus(4), "pool p", affinity="anti_affinity", required=False, affinity_hosts=frozenset("ab"))
    assert names(place(avoid_all, hosts)) == ["a"]


def test_hot_standby_hosts_come_last():
    hosts = [node(1, "standby", hot_standby=True), node(2, "busy", gpus(4), 2)]
    assert names(place(Request(1, gpus(2), "pool p"), hosts)) == ["busy"]
    assert names(place(Request(2, gpus(4), "pool p"), hosts)) == ["busy", "standby"]


# -- capacity and the timers, on the database ------------------------------------------------
@pytest.fixture
def owner_and_workspace(db):
    owner = get_user_model().objects.create_user("sched-owner", password="x")
    return owner, Workspace.objects.create(name="sched")


def _job(owner_and_workspace, **fields) -> TrainingJob:
    owner, workspace = owner_and_workspace
    return TrainingJob.objects.create(workspace=workspace, created_by=owner, name="j", command="true", **fields)


def _task_run(job: TrainingJob, host: DockerHost, index: int, number: int = 1, **fields) -> TaskRun:
    attempt, _ = Attempt.objects.get_or_create(job=job, number=number)
    fields.setdefault("container_name", f"c-{job.id.hex}-{index}")
    fields.setdefault("state", TaskRun.State.RUNNING)
    return TaskRun.objects.create(attempt=attempt, index=index, host=host, **fields)


def test_pool_usage_of_a_gpu_pool(owner_and_workspace, django_assert_num_queries):
    pool = ResourcePool.objects.create(name="gpu", kind="dedicated", node_cpus=64, node_memory_gb=512, node_gpus=8)
    g1, g2, g3 = (DockerHost.objects.create(name=n, base_url="tcp://192.0.2.1:2375", pool=pool) for n in "123")
    for name, flags in [("iso", {"isolated": True}), ("standby", {"hot_standby": True}), ("off", {"enabled": False})]:
        DockerHost.objects.create(name=name, base_url="tcp://192.0.2.9:2375", pool=pool, **flags)
    four = Flavor.objects.create(name="gpu.4", cpus=16, memory_mb=128 * 1024, gpus=4)
    flavored = _job(owner_and_workspace, pool_type="dedicated", pool=pool, flavor=four)
    custom = _job(
        owner_and_workspace,
        pool_type="dedicated",
        pool=pool,
        spec_type="custom",
        custom_cpus=8,
        custom_memory_gb=32,
        custom_gpus=2,
        node_count=2,
    )
    _task_run(flavored, g1, 0)
    _task_run(custom, g1, 0)
    run = _task_run(custom, g2, 1)
    # A process-level restart: a second task run of the same container counts once.
    _task_run(custom, g2, 1, number=2, container_name=run.container_name, state=TaskRun.State.CREATED)
    _task_run(_job(owner_and_workspace, flavor=four), g3, 0, state=TaskRun.State.EXITED)  # ended: frees its share

    with django_assert_num_queries(2):
        usage = pool_usage(pool)
    assert (usage.nodes_total, usage.nodes_free) == (3, 1)
    assert (usage.free_gpus, usage.free_cpus, usage.free_memory_gb) == (2 + 6 + 8, 40 + 56 + 64, 352 + 480 + 512)
    assert usage.fragmentation == 0.5  # 8 of the 16 free GPUs are on partly used nodes
    assert usage.text() == "1/3 nodes free · 16 GPUs · 160 CPUs · 1344 GB · fragmentation 50%"
    assert host_free(g1).free == Resources(cpus=40, memory_gb=352, gpus=2)


def test_auto_stop_counts_from_the_first_start(owner_and_workspace, settings):
    settings.HOUR_S = 2
    now = timezone.now()
    due = _job(
        owner_and_workspace, phase=Phase.RUNNING, auto_stop_hours=1, started_at=now - timezone.timedelta(seconds=3)
    )
    long_queued = _job(
        owner_and_workspace,
        phase=Phase.RUNNING,
        auto_stop_hours=1,
        created_at=now - timezone.timedelta(days=1),  # queued for a day, running for a second
        started_at=now - timezone.timedelta(seconds=1),
    )
    never_started = _job(owner_and_workspace, phase=Phase.PENDING, auto_stop_hours=1, created_at=long_queued.created_at)
    no_auto_stop = _job(owner_and_workspace, phase=Phase.RUNNING, started_at=due.started_at)
    assert reconcile.auto_stop_jobs()
    for job in (due, long_queued, never_started, no_auto_stop):
        job.refresh_from_db()
    assert (due.phase, due.terminate_requested) == (Phase.TERMINATING, True)
    assert due.phase_reason == "Auto stopped after 1 hour of running."
    assert stop.stop_reason(due) == due.phase_reason
    assert [j.phase for j in (long_queued, never_started, no_auto_stop)] == [
        Phase.RUNNING,
        Phase.PENDING,
        Phase.RUNNING,
    ]
    assert not reconcile.auto_stop_jobs()  # asked once


# -- against the real worker and Docker --------------------------------------------------------
@pytest.fixture
def ded(demo):
    """A dedicated pool of 2-CPU nodes with one host, node-a (the local engine); add_node adds more."""
    pool = ResourcePool.objects.create(
        name="ded", kind="dedicated", node_cpus=2, node_memory_gb=4, check_root_gb=0.5, check_cache_gb=0.5
    )

    class Ded:
        pass

    d = Ded()
    d.pool, d.demo = pool, demo
    d.one = Flavor.objects.create(name="cpu.1u", cpus=1, memory_mb=256)
    d.two = Flavor.objects.create(name="cpu.2u", cpus=2, memory_mb=256)
    d.add_node = lambda name: DockerHost.objects.create(
        name=name, base_url=django_settings.DEFAULT_DOCKER_URL, pool=pool
    )
    d.node_a = d.add_node("node-a")
    return d


def dedicated_job(ded, **fields) -> TrainingJob:
    defaults = dict(name="ded-job", pool_type="dedicated", pool=ded.pool, flavor=ded.one, command="echo hi")
    return submit_job(ded.demo, **(defaults | fields))


def hosts_of(job: TrainingJob) -> list[str]:
    return [r.host.name for r in job.attempts.get().task_runs.select_related("host").order_by("index")]


def running(job: TrainingJob) -> bool:
    return reload(job).phase == Phase.RUNNING


def containers(docker_client, job: TrainingJob) -> list:
    return docker_client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job.id}"})


@pytest.mark.django_db(transaction=True)
def test_dedicated_jobs_use_their_pool_and_pool_usage_counts_them(ded, worker):
    ded.add_node("node-b")
    sleeper = dedicated_job(ded, name="sleeper", command="sleep 60")
    wait_for(lambda: running(sleeper), message="the sleeper running")
    usage = pool_usage(ded.pool)
    assert (usage.nodes_total, usage.nodes_free, usage.free_gpus) == (2, 1, 0)
    assert (usage.free_cpus, usage.free_memory_gb) == (3, 7.75)
    assert usage.fragmentation == pytest.approx(1 / 3, abs=1e-3)  # 1 of the 3 free CPUs is on a used node
    assert usage.text() == "1/2 nodes free · 3 CPUs · 7.75 GB · fragmentation 33%"
    busy = DockerHost.objects.get(name=hosts_of(sleeper)[0])
    assert host_free(busy).free == Resources(cpus=1, memory_gb=3.75, gpus=0)

    pair = dedicated_job(ded, name="pair", node_count=2)
    public = submit_job(ded.demo, name="public", command="echo public")
    wait_for(lambda: ended(pair) and ended(public), message="both jobs to end")
    assert pair.phase == public.phase == Phase.COMPLETED, (pair.phase_reason, public.phase_reason)
    assert sorted(hosts_of(pair)) == ["node-a", "node-b"]  # one CPU free on each: spread
    assert hosts_of(public) == ["local"]  # the demo host is in a public pool


@pytest.mark.django_db(transaction=True)
def test_a_job_waits_for_capacity_and_starts_once_it_is_free(ded, worker, docker_client):
    big = dedicated_job(ded, name="big", flavor=ded.two, command="sleep 60")
    wait_for(lambda: running(big), message="the big job running")
    small = dedicated_job(ded, name="small")
    wait_for(lambda: "Waiting for capacity" in reload(small).phase_reason, message="the Pending reason")
    assert small.phase == Phase.PENDING
    assert small.phase_reason == "Waiting for capacity: no host of pool ded has 1 free CPU."
    assert not small.attempts.exists()
    stop.request_terminate(big.id)
    wait_for(lambda: ended(small), timeout=40, message="the small job to run once the big one stopped")
    assert small.phase == Phase.COMPLETED and small.phase_reason == ""
    assert hosts_of(small) == ["node-a"]


@pytest.mark.django_db(transaction=True)
def test_pending_jobs_start_by_priority_then_age(ded, worker):
    blocker = dedicated_job(ded, name="blocker", flavor=ded.two, command="sleep 60")
    wait_for(lambda: running(blocker), message="the blocker running")
    low = dedicated_job(ded, name="low", flavor=ded.two, priority=1)
    high = dedicated_job(ded, name="high", flavor=ded.two, priority=2)
    high_later = dedicated_job(ded, name="high-later", flavor=ded.two, priority=2)
    wait_for(lambda: "Queued behind high " in reload(low).phase_reason, message="the queue order in the reasons")
    assert reload(high).phase_reason == "Waiting for capacity: no host of pool ded has 2 free CPUs."
    wait_for(lambda: "Queued behind high " in reload(high_later).phase_reason, message="the later job queued")
    stop.request_terminate(blocker.id)
    for job in (high, high_later, low):
        wait_for(lambda job=job: ended(job), timeout=40, message=f"{job.name} to end")
        assert job.phase == Phase.COMPLETED, job.phase_reason
    assert high.started_at < high_later.started_at < low.started_at


@pytest.mark.django_db(transaction=True)
def test_strong_and_weak_affinity_with_a_second_engine(ded, worker, second_host):
    engine, second = second_host
    DockerHost.objects.filter(id=second.id).update(pool=ded.pool)
    to_second = dedicated_job(ded, name="to-second", affinity="affinity", affinity_hosts=["second"])
    not_second = dedicated_job(ded, name="not-second", affinity="anti_affinity", affinity_hosts=["second"])
    wait_for(lambda: ended(to_second) and ended(not_second), timeout=40, message="both jobs to end")
    assert to_second.phase == not_second.phase == Phase.COMPLETED, (to_second.phase_reason, not_second.phase_reason)
    assert (hosts_of(to_second), hosts_of(not_second)) == (["second"], ["node-a"])

    # The second host is off: strong affinity waits (and says why), weak affinity falls back.
    DockerHost.objects.filter(id=second.id).update(enabled=False)
    strong = dedicated_job(ded, name="strong", affinity="affinity", affinity_hosts=["second"])
    weak = dedicated_job(
        ded, name="weak", affinity="affinity", affinity_strength="preferred", affinity_hosts=["second"]
    )
    wait_for(lambda: ended(weak), message="the weak-affinity job to end")
    assert weak.phase == Phase.COMPLETED and hosts_of(weak) == ["node-a"]
    wait_for(lambda: "affinity hosts" in reload(strong).phase_reason, message="the strong job's reason")
    assert strong.phase == Phase.PENDING
    assert strong.phase_reason == "No healthy host of pool ded is among the affinity hosts (second)."
    DockerHost.objects.filter(id=second.id).update(enabled=True)
    wait_for(lambda: ended(strong), timeout=40, message="the strong-affinity job to run on its host")
    assert strong.phase == Phase.COMPLETED and hosts_of(strong) == ["second"]
    # The fixture's clean-up lists the engine's containers: let the followers remove theirs first.
    engine_client = docker.DockerClient(base_url=engine.socket, timeout=10)
    wait_for(lambda: not engine_client.containers.list(all=True, sparse=True), message="the second engine empty")


@pytest.mark.django_db(transaction=True)
def test_auto_stop_stops_a_job_after_its_hours_of_running(demo, worker, docker_client, settings):
    settings.HOUR_S = 3  # in this process: the test runs the reconcile step itself
    DockerHost.objects.filter(id=demo.host.id).update(enabled=False)
    job = submit_job(demo, name="auto-stop", auto_stop_hours=1, command="while true; do echo tick; sleep 0.2; done")
    wait_for(lambda: "Waiting for a healthy" in reload(job).phase_reason, message="the job queued")
    TrainingJob.objects.filter(id=job.id).update(created_at=timezone.now() - timezone.timedelta(hours=2))
    assert not reconcile.auto_stop_jobs()  # queued, however long: not counted
    DockerHost.objects.filter(id=demo.host.id).update(enabled=True)
    wait_for(lambda: running(job), message="the job running")
    assert not reconcile.auto_stop_jobs()
    wait_for(reconcile.auto_stop_jobs, timeout=15, message="auto stop")
    stopped_after = (timezone.now() - reload(job).started_at).total_seconds()
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    assert stopped_after >= 3
    assert job.phase == Phase.TERMINATED
    assert job.phase_reason == "Auto stopped after 1 hour of running."
    assert job.events.get(kind=EventKind.TERMINATED).message == job.phase_reason
    assert job.attempts.get().outcome == Attempt.Outcome.TERMINATED
    wait_for(lambda: not containers(docker_client, job), message="its container removed")


@pytest.mark.django_db(transaction=True)
def test_retention_keeps_the_containers_then_removes_them(ded, worker, docker_client, settings):
    settings.HOUR_S = 3  # in this process: the test runs the reconcile step itself
    done = dedicated_job(ded, name="kept", retention_hours=1, command="echo result > /tmp/out; echo done")
    failed = dedicated_job(ded, name="kept-failed", retention_hours=2, command="echo broken; exit 3")
    wait_for(lambda: reload(done).phase == Phase.COMPLETED_RETAINED, message="Completed (retained)")
    wait_for(lambda: reload(failed).phase == Phase.FAILED_RETAINED, message="Failed (retained)")
    assert done.phase_reason == "Containers kept for 1 hour (retention)."
    assert failed.phase_reason.endswith("Containers kept for 2 hours (retention).")
    assert done.events.get(kind=EventKind.COMPLETED).message == "The job completed. " + done.phase_reason
    assert failed.events.filter(kind=EventKind.FAILED).exists()
    kept = containers(docker_client, done)
    assert len(kept) == 1 and len(containers(docker_client, failed)) == 1
    # What the job left is there to look at.
    assert docker_client.containers.get(kept[0].id).logs().decode().strip().endswith("done")

    # Stopping a retained job releases it now.
    assert stop.request_terminate(failed.id)
    wait_for(lambda: reload(failed).phase == Phase.FAILED, message="Failed after the release")
    assert failed.phase_reason.endswith("Containers removed when the user stopped the job.")
    assert not containers(docker_client, failed)

    assert not reconcile.release_retained_jobs()  # an "hour" has not passed yet
    wait_for(reconcile.release_retained_jobs, timeout=15, message="the retention to end")
    wait_for(lambda: reload(done).phase == Phase.COMPLETED, message="Completed after the retention")
    assert done.phase_reason == "Containers removed after 1 hour."
    assert not containers(docker_client, done)
    assert done.events.filter(kind=EventKind.COMPLETED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_stopping_a_job_with_retention_keeps_nothing(ded, worker, docker_client):
    job = dedicated_job(ded, name="stopped", retention_hours=1, node_count=2, command="sleep 60")
    wait_for(lambda: running(job), message="the job running")
    stop.request_terminate(job.id)
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    assert (job.phase, job.phase_reason) == (Phase.TERMINATED, "Stopped by the user.")
    wait_for(lambda: not containers(docker_client, job), message="its containers removed")
