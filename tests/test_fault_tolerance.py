"""SPEC §4-§6 against real containers: each rule proven by a real fault."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from jobs.models import DockerHost, EventKind, Flavor, Phase, TaskRun, TrainingJob
from jobs.runtime import stop
from tests.helpers import ended, log_texts, reload, submit_job, wait_for, worker_pausing_at

pytestmark = pytest.mark.django_db(transaction=True)


def make_job(demo, **fields) -> TrainingJob:
    return submit_job(demo, **(dict(name="ft") | fields))


def test_transient_failure_restarts_the_process_in_the_same_container(demo, worker):
    # First attempt prints an NCCL timeout and exits 1 (transient); the retry succeeds.
    job = make_job(
        demo,
        fault_tolerance=True,
        max_restarts=3,
        command='if [ "$MA_ATTEMPT" = 1 ]; then echo "NCCL watchdog: collective operation timeout"; exit 1; fi; '
        "echo recovered in attempt $MA_ATTEMPT",
    )
    wait_for(lambda: ended(job), timeout=40, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    first, second = [a.task_runs.get() for a in job.attempts.order_by("number")]
    assert second.attempt.level == "process"
    assert second.container_id == first.container_id  # same container, process restarted inside
    assert first.exit_code == 1 and second.exit_code == 0
    record = job.recoveries.get()
    assert (record.failure_class, record.level, record.restart) == ("transient", "process", True)
    assert any("NCCL" in line for line in record.matched_lines)
    assert job.restarts_used == 1

    assert log_texts(second)[-1] == "recovered in attempt 2"
    assert not any("recovered" in text for text in log_texts(first))


def test_a_decision_slower_than_a_heartbeat_leaves_the_run_to_its_one_follower(demo, worker, monkeypatch):
    """The follower decides a process exit in its own thread (and starts the restart there). When
    that took longer than FOLLOWER_STALE_AFTER_S (the failure's log read through the terminal on a
    busy machine, a slow database), its heartbeat went stale: reconcile's drain took the ended run
    as one whose follower died and followed the container on into that run's log, the restart's
    lines too, for the container's whole life. Here reading the failure's evidence is made slow in
    the real worker (a pause point), for the follower's decision and reconcile's alike."""
    from django.conf import settings

    command = (
        'if [ "$MA_ATTEMPT" = 1 ]; then echo "NCCL watchdog: collective operation timeout"; exit 1; fi; '
        'for i in 1 2 3; do echo "attempt $MA_ATTEMPT line $i"; sleep 1; done'
    )
    pause_s = 3 * settings.FOLLOWER_STALE_AFTER_S  # reconcile's drain looks several times meanwhile
    with worker_pausing_at(worker, monkeypatch, "reading-failure-evidence", pause_s):
        job = make_job(demo, fault_tolerance=True, max_restarts=3, command=command)
        wait_for(lambda: ended(job), timeout=60 + pause_s, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    first, second = [a.task_runs.get() for a in job.attempts.order_by("number")]
    assert second.attempt.level == "process" and second.container_id == first.container_id
    first_lines = log_texts(first)
    assert "NCCL watchdog: collective operation timeout" in first_lines
    assert first_lines[-1].startswith("[console] process exited with code 1"), first_lines
    assert not any("attempt 2" in text for text in first_lines), first_lines
    second_lines = log_texts(second)
    assert [t for t in second_lines if t.startswith("attempt 2")] == [f"attempt 2 line {i}" for i in (1, 2, 3)]


def test_unconditional_restart_stops_after_three_in_a_row_leaving_seven(demo, worker):
    # Seed 000's example: R = 10 with U on, a job that always fails with a user error.
    job = make_job(
        demo,
        fault_tolerance=True,
        max_restarts=10,
        unconditional_restart=True,
        command="echo 'Traceback (most recent call last):'; echo 'ValueError: bad config'; exit 1",
    )
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    assert job.phase == Phase.FAILED
    assert (job.restarts_used, job.max_restarts - job.restarts_used) == (3, 7)
    records = list(job.recoveries.order_by("detected_at"))
    assert [r.restart for r in records] == [True, True, True, False]
    assert {r.failure_class for r in records} == {"user_error"}
    assert "unconditional" in records[0].decision


def test_oom_is_a_resource_error_and_not_restarted(demo, worker):
    tiny = Flavor.objects.create(name="cpu.tiny", cpus=1, memory_mb=24)
    job = make_job(demo, flavor=tiny, fault_tolerance=True, max_restarts=3, command="echo allocating; tail /dev/zero")
    wait_for(lambda: ended(job), timeout=40, message="the job to end")
    assert job.phase == Phase.FAILED
    record = job.recoveries.get()
    assert (record.failure_class, record.oom_killed, record.restart) == ("resource_error", True, False)


def test_hang_restarts_three_times_without_consuming_max_restarts(demo, worker):
    # Seed 000's example: R = 10 with H on, a job that hangs 4 times in a row.
    job = make_job(
        demo,
        fault_tolerance=True,
        max_restarts=10,
        hang_restart=True,
        hang_window_s=3,
        command="echo started run $MA_PROCESS_RUN; sleep 100000",
    )
    wait_for(lambda: ended(job), timeout=90, interval=0.5, message="the job to end")
    assert job.phase == Phase.FAILED
    assert (job.hang_restarts_used, job.restarts_used, job.max_restarts) == (3, 0, 10)
    records = list(job.recoveries.order_by("detected_at"))
    assert [(r.failure_class, r.restart, r.level) for r in records] == [("hang", True, "process")] * 3 + [
        ("hang", False, "")
    ]
    assert records[0].evidence["hang"]["idle_for_s"] >= 3
    container_ids = {a.task_runs.get().container_id for a in job.attempts.all()}
    assert len(container_ids) == 1  # every hang restart was in place
    assert job.events.filter(kind=EventKind.SUSPECTED_HANG).count() == 4


def test_suspected_hang_without_hang_restart_is_only_an_event(demo, worker):
    job = make_job(demo, fault_tolerance=True, max_restarts=2, hang_window_s=2, command="sleep 100000")
    wait_for(lambda: job.events.filter(kind=EventKind.SUSPECTED_HANG).exists(), timeout=30, message="the event")
    assert reload(job).phase == Phase.RUNNING
    assert job.attempts.count() == 1 and not job.recoveries.exists()
    stop.request_terminate(job.id)
    wait_for(lambda: ended(job), message="termination")


def test_a_silent_job_that_computes_is_not_hung(demo, worker):
    """No log line, but CPU in use (~10 % of a core, in bursts): window after window its CPU is
    measured busy, so no hang is suspected. It used to be suspected within seconds: silence
    alone counted once the window had passed (before two readings had measured anything), and
    the follower's own ticks cleared the sampler's last reading, so intervals went unmeasured."""
    busy_then_rest = "while :; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 0.5; done"
    job = make_job(
        demo, fault_tolerance=True, max_restarts=2, hang_restart=True, hang_window_s=3, command=busy_then_rest
    )

    def followed_for_s() -> float:
        run = TaskRun.objects.filter(attempt__job=job).first()
        if run is None or run.started_at is None or run.follower_heartbeat is None:
            return 0.0
        return (run.follower_heartbeat - run.started_at).total_seconds()

    def hang_suspected() -> bool:
        return job.events.filter(kind=EventKind.SUSPECTED_HANG).exists()

    wait_for(lambda: hang_suspected() or followed_for_s() >= 15, timeout=60, message="five windows of following")
    assert not hang_suspected()
    assert reload(job).phase == Phase.RUNNING and job.attempts.count() == 1
    stop.request_terminate(job.id)
    wait_for(lambda: ended(job), message="termination")


def test_failed_environment_check_isolates_the_host_and_waits_for_the_operator(demo, worker):
    demo.pool.check_cache_gb = 100000  # more than any test disk has
    demo.pool.save()
    job = make_job(demo, fault_tolerance=True, max_restarts=2, command="echo training")
    wait_for(lambda: reload(job).phase == Phase.PENDING and job.recoveries.exists(), timeout=30, message="Pending")
    host = DockerHost.objects.get(id=demo.host.id)
    assert host.isolated and "environment check" in host.isolation_reason
    assert "Waiting for a healthy Docker host" in job.phase_reason and "local isolated" in job.phase_reason
    record = job.recoveries.get()
    assert (record.failure_class, record.level, record.restart) == ("env_check_failed", "job", True)
    assert any("disk-size cache" in line or "error,exiting" in line for line in record.matched_lines)
    assert job.events.filter(kind=EventKind.HOST_ISOLATED).exists()
    assert job.events.filter(kind=EventKind.ENV_CHECK_FAILED).exists()
    first = job.attempts.get().task_runs.get()

    assert "[env-check] error,exiting" in log_texts(first)

    # The operator fixes the host and clears the isolation with the admin's action.
    demo.pool.check_cache_gb = 0.5
    demo.pool.save()
    operator = Client()
    operator.force_login(get_user_model().objects.create_superuser("operator", password="operator-password"))
    response = operator.post(
        "/admin/jobs/dockerhost/",
        {"action": "clear_isolation", "_selected_action": [host.id]},
        follow=True,
    )
    assert "Cleared isolation of 1 host(s)." in response.content.decode()
    wait_for(lambda: ended(job), timeout=40, message="the job to run once a host is healthy")
    assert job.phase == Phase.COMPLETED
    record.refresh_from_db()
    assert record.next_attempt is not None and record.running_again_at is not None
    assert job.restarts_used == 1


def test_two_workers_racing_make_exactly_one_decision(demo, worker, celery_worker_process):
    from tests.processes import ManagedProcess

    second = ManagedProcess("celery-worker-2", celery_worker_process.argv)
    second.start()
    try:
        job = make_job(
            demo,
            fault_tolerance=True,
            max_restarts=3,
            node_count=2,
            command="sleep 1; exit 3",
        )
        wait_for(lambda: ended(job), timeout=60, message="the job to end")
    finally:
        second.stop()
    assert job.phase == Phase.FAILED
    # Both instances failed at the same moment; one decision per attempt.
    assert job.recoveries.count() == job.attempts.count() == 1
    assert job.restarts_used == 0
    assert TaskRun.objects.filter(attempt__job=job).count() == 2
    assert timezone.now() > job.ended_at
