"""Restarts of a 2-instance job against real containers: every line each instance wrote
is persisted to the run (attempt, instance) that wrote it, in order, once; no follower
is left holding a claim once the job ended; a process-level restart restarts every
instance exactly once per decision (SPEC §4).

What "every line" is comes from Docker itself: the test reads each container's log
from its start to its end on a stream of its own, so the comparison also holds for
lines written around a kill, which no fixed expectation could predict."""

from __future__ import annotations

import threading

import docker
import pytest

from jobs.models import Attempt, Phase, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, schedule, stop
from jobs.runtime.logs import read_lines, split_frame
from tests.helpers import describe, ended, submit_job, wait_for, worker_dying_at

pytestmark = pytest.mark.django_db(transaction=True)

LINES = 20


def numbered(first_attempt_tail: str, first_attempt_lines: int = LINES, rank: str = "$RANK") -> str:
    """Each rank prints numbered lines; attempt 1 ends with first_attempt_tail, later ones exit 0.
    first_attempt_lines: how many lines attempt 1 prints on the ranks that match `rank`."""
    return (
        'echo "r$RANK attempt $MA_ATTEMPT"; n=' + str(LINES) + "; "
        f'[ "$MA_ATTEMPT" = 1 ] && [ "$RANK" = "{rank}" ] && n={first_attempt_lines}; '
        'i=0; while [ $i -lt $n ]; do i=$((i+1)); echo "r$RANK line $i"; sleep 0.1; done; '
        f'if [ "$MA_ATTEMPT" = 1 ]; then {first_attempt_tail}; fi; echo "r$RANK done"'
    )


class ContainerLog(threading.Thread):
    """Docker's log of one container, (ts_ns, text) per line, read until the container ends."""

    def __init__(self, container_id: str):
        super().__init__(daemon=True, name=f"test-log-{container_id[:12]}")
        self.client = docker.from_env()  # a client of its own: this thread streams
        self.container = self.client.containers.get(container_id)
        self.lines: list[tuple[int, str]] = []
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            for frame in self.container.logs(stream=True, follow=True, timestamps=True):
                self.lines.append(split_frame(frame))
        except Exception as exc:  # reported by result(): a gap would make the comparison wrong
            self.error = exc

    def result(self) -> list[tuple[int, str]]:
        self.join(30)
        assert not self.is_alive(), f"{self.container.name} still running"
        assert self.error is None, self.error
        return self.lines


def make_job(demo, command: str, **fields) -> TrainingJob:
    return submit_job(demo, **(dict(name="multi", node_count=2, fault_tolerance=True, command=command) | fields))


def runs_of(job, attempt: int) -> dict[int, TaskRun]:
    return {r.index: r for r in TaskRun.objects.filter(attempt__job=job, attempt__number=attempt)}


def follow_containers(job, attempt: int, min_lines: int = 0) -> dict[int, ContainerLog]:
    """Both instances of the attempt running (with min_lines persisted each): read their Docker logs."""

    def running():
        runs = runs_of(job, attempt)
        up = all(r.state == TaskRun.State.RUNNING and r.log_lines >= min_lines for r in runs.values())
        return runs if len(runs) == 2 and up else None

    runs = wait_for(running, timeout=30, message=f"both instances of attempt {attempt} running")
    return {index: ContainerLog(run.container_id) for index, run in runs.items()}


def persisted(job, attempt: int, index: int) -> list[tuple[int, str]]:
    run = TaskRun.objects.select_related("attempt").get(attempt__job=job, attempt__number=attempt, index=index)
    lines = read_lines(run)
    assert [line.number for line in lines] == list(range(1, run.log_lines + 1))
    return [(line.ts_ns, line.text) for line in lines]


def user_lines(lines: list[tuple[int, str]], rank: int) -> list[str]:
    return [text for _, text in lines if text.startswith(f"r{rank} line ")]


def wait_until_ended_without_followers(job, timeout: float = 60) -> None:
    def released() -> bool:
        return not TaskRun.objects.filter(attempt__job=job, follower_token__isnull=False).exists()

    try:
        wait_for(lambda: ended(job), timeout=timeout, message="the job to end")
        # A decision that ends the job stops the instances still running right after it
        # (each within STOP_TIMEOUT_S); their followers persist the last lines and let go.
        # None may stay: a claim held past that is a follower stuck, its log not whole.
        wait_for(released, timeout=2 * stop.STOP_TIMEOUT_S + 5, message="every follower to let go")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{describe()}") from None


def assert_container_level_logs(job, logs: dict[tuple[int, int], ContainerLog]) -> None:
    """One container per (attempt, instance): its whole Docker log is that run's persisted log."""
    for (attempt, index), docker_log in logs.items():
        expected = docker_log.result()
        assert expected, f"attempt {attempt} worker-{index} printed nothing"
        assert persisted(job, attempt, index) == expected, f"attempt {attempt} worker-{index}"
    for index in (0, 1):
        assert user_lines(persisted(job, 2, index), index) == [f"r{index} line {i}" for i in range(1, LINES + 1)]


def test_a_killed_instance_restarts_both_containers_and_loses_no_line(demo, worker, docker_client):
    job = make_job(demo, numbered("true", first_attempt_lines=600), max_restarts=2)
    logs = {(1, i): log for i, log in follow_containers(job, 1, min_lines=5).items()}
    docker_client.containers.get(runs_of(job, 1)[0].container_id).kill()  # SIGKILL from outside

    logs.update({(2, i): log for i, log in follow_containers(job, 2).items()})
    wait_until_ended_without_followers(job)
    assert job.phase == Phase.COMPLETED, job.phase_reason
    record = job.recoveries.get()
    assert (record.failure_class, record.level, record.exit_code) == ("transient", "container", 137)
    assert record.task_index == 0
    assert [(a.number, a.level, a.outcome) for a in job.attempts.order_by("number")] == [
        (1, "initial", Attempt.Outcome.FAILED),
        (2, "container", Attempt.Outcome.SUCCEEDED),
    ]
    first, second = runs_of(job, 1), runs_of(job, 2)
    assert {first[0].container_id, first[1].container_id}.isdisjoint({second[0].container_id, second[1].container_id})
    assert first[0].exit_code == 137 and {second[0].exit_code, second[1].exit_code} == {0}
    assert_container_level_logs(job, logs)
    # The first attempt was cut short: each rank's lines are a gap-free prefix.
    for index in (0, 1):
        lines = user_lines(persisted(job, 1, index), index)
        assert lines and lines == [f"r{index} line {i}" for i in range(1, len(lines) + 1)]


def test_unconditional_restart_of_a_user_error_recreates_both_containers(demo, worker):
    # user_error with U: the policy restarts at container level (faulttolerance.policy.level_for).
    # Attempt 1 ends 3 s in: the new ranks join while the old ones' endpoints are torn down, which
    # on one shared network took a new rank's name with them (the dns check failed, the host was
    # isolated; docs/decisions.md "A network per attempt").
    job = make_job(demo, numbered("sleep 3; exit 1"), max_restarts=3, unconditional_restart=True)
    logs = {(1, i): log for i, log in follow_containers(job, 1).items()}
    logs.update({(2, i): log for i, log in follow_containers(job, 2).items()})
    wait_until_ended_without_followers(job)
    assert job.phase == Phase.COMPLETED, job.phase_reason
    record = job.recoveries.get()
    assert (record.failure_class, record.level, record.restart) == ("user_error", "container", True)
    assert job.restarts_used == 1 and job.attempts.count() == 2
    assert_container_level_logs(job, logs)
    for (attempt, index), docker_log in logs.items():
        networks = set(docker_log.container.attrs["NetworkSettings"]["Networks"])
        assert networks == {docker_hosts.job_network(job, attempt)}, (attempt, index, networks)


def test_a_past_attempts_network_goes_once_its_containers_have(demo, worker, docker_client):
    """Docker's address pools hold about thirty networks: a restarted job's old network is removed
    while the job runs on, not at its end, and the new attempt's stays."""
    command = '[ "$MA_ATTEMPT" = 1 ] && [ "$RANK" = 1 ] && exit 1; sleep 300'
    job = make_job(demo, command, max_restarts=3, unconditional_restart=True)
    follow_containers(job, 2)

    def network_names() -> set[str]:
        return {n.name for n in docker_client.networks.list(filters={"label": f"console.job={job.id}"})}

    first, second = docker_hosts.job_network(job, 1), docker_hosts.job_network(job, 2)
    wait_for(lambda: first not in network_names(), timeout=30, message=f"{first} removed")
    assert second in network_names()
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING, job.phase_reason
    assert TaskRun.objects.filter(attempt__job=job, state=TaskRun.State.RUNNING).count() == 2
    stop.request_terminate(job.id)
    wait_until_ended_without_followers(job)


NCCL_FAILURE = 'echo "NCCL watchdog: collective operation timeout"; exit 1'


def assert_process_level_logs(job, logs: dict[int, ContainerLog], attempts: int) -> None:
    """One container per instance for every attempt: its Docker log is the attempts' persisted
    logs one after the other, and the launcher ran the command once per attempt."""
    for index, docker_log in logs.items():
        expected = docker_log.result()
        runs = [persisted(job, attempt, index) for attempt in range(1, attempts + 1)]
        assert [line for run in runs for line in run] == expected, f"worker-{index}"
        texts = [text for _, text in expected]
        for attempt in range(2, attempts + 1):
            restarted = f"[console] process restarted in the same container (run {attempt}, attempt {attempt})"
            assert texts.count(restarted) == 1, f"worker-{index} restarted {texts.count(restarted)}x for {attempt}"
            assert runs[attempt - 1][0][1] == restarted, f"worker-{index} attempt {attempt} starts elsewhere"
        assert not any(f"(run {attempts + 1}," in text for text in texts)
        # Attempt 1 may be cut short by the other rank's failure; its lines are a gap-free prefix.
        first = user_lines(runs[0], index)
        assert first == [f"r{index} line {i}" for i in range(1, len(first) + 1)]


def test_a_transient_failure_restarts_each_instance_in_place_exactly_once(demo, worker):
    job = make_job(demo, numbered(NCCL_FAILURE), max_restarts=3)
    logs = follow_containers(job, 1)
    wait_until_ended_without_followers(job)
    assert job.phase == Phase.COMPLETED, f"{job.phase_reason}\n{describe()}"
    record = job.recoveries.get()
    assert (record.failure_class, record.level, record.restart) == ("transient", "process", True)
    assert job.restarts_used == 1
    attempts = list(job.attempts.order_by("number"))
    assert [(a.number, a.level, a.outcome) for a in attempts] == [
        (1, "initial", Attempt.Outcome.FAILED),
        (2, "process", Attempt.Outcome.SUCCEEDED),
    ]
    first, second = runs_of(job, 1), runs_of(job, 2)
    for index in (0, 1):
        assert second[index].reuses_container and second[index].container_id == first[index].container_id
        assert second[index].exit_code == 0
        assert user_lines(persisted(job, 2, index), index) == [f"r{index} line {i}" for i in range(1, LINES + 1)]
    assert_process_level_logs(job, logs, attempts=2)


def test_a_process_level_restart_that_fails_again_ends_as_the_policy_says(demo, worker):
    # R = 1: the first transient failure restarts both instances in place (1/1 used); the
    # second failure finds the budget used up and the job ends Failed, without a third run.
    command = numbered(NCCL_FAILURE).replace('if [ "$MA_ATTEMPT" = 1 ]; then', "if true; then")
    job = make_job(demo, command, max_restarts=1)
    logs = follow_containers(job, 1)
    wait_until_ended_without_followers(job)
    assert job.phase == Phase.FAILED, job.phase_reason
    assert "max restarts used up (1/1)" in job.phase_reason
    records = list(job.recoveries.order_by("detected_at"))
    assert [(r.failure_class, r.restart, r.level) for r in records] == [
        ("transient", True, "process"),
        ("transient", False, ""),
    ]
    assert job.attempts.count() == 2 and job.restarts_used == 1
    # The rank that failed first ran its whole attempt 2 (nothing killed it early).
    failed = records[1].task_index
    assert user_lines(persisted(job, 2, failed), failed) == [f"r{failed} line {i}" for i in range(1, LINES + 1)]
    assert_process_level_logs(job, logs, attempts=2)


def test_a_run_restarted_in_place_and_followed_afresh_starts_at_its_restart_line(demo, celery_worker_process):
    """The follower of an instance died before the restart (its worker was lost), so the
    restarted run is followed on a stream of its own, as reconcile's adoption does, and
    not handed over at the old run's exit marker. The old run's process is killed by the
    restart, after the new run's started_at: its exit marker is not the new run's end.

    This test is the supervisor itself, each step in order in this process (the Celery
    worker is stopped; the next test's `worker` fixture starts it again)."""
    from django.db import connection

    from jobs.runtime.follow import follow_task_run

    celery_worker_process.stop()
    # Rank 0 fails first; rank 1 would run on for a minute: the restart kills it.
    job = make_job(demo, numbered(NCCL_FAILURE, first_attempt_lines=600, rank="1"), max_restarts=3)
    threads: list[threading.Thread] = []

    def follow(task_run_id: int) -> None:
        def run() -> None:
            try:
                follow_task_run(task_run_id)
            finally:
                connection.close()

        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()

    try:
        schedule.schedule_job(job.id)  # creates and starts attempt 1 here
        logs = follow_containers(job, 1)  # Docker's own record of both containers
        first = runs_of(job, 1)
        follow(first[0].id)  # rank 1's follower is gone: nobody follows first[1]
        second = wait_for(
            lambda: (runs := runs_of(job, 2)) and runs[1].state == TaskRun.State.RUNNING and runs,
            timeout=30,
            message="attempt 2 started",
        )
        follow(second[1].id)
        wait_for(lambda: Attempt.objects.get(job=job, number=2).outcome, timeout=60, message="attempt 2 to end")
        # Read as its own, rank 1's old exit marker (code 137) ended attempt 2 as well.
        assert Attempt.objects.get(job=job, number=2).outcome == Attempt.Outcome.SUCCEEDED, describe()
        wait_until_ended_without_followers(job)
        assert job.phase == Phase.COMPLETED, f"{job.phase_reason}\n{describe()}"
        assert job.attempts.count() == 2 and job.restarts_used == 1
        rank1 = persisted(job, 2, 1)
        assert rank1[0][1] == "[console] process restarted in the same container (run 2, attempt 2)"
        assert not any(text.startswith("[console] process exited") for _, text in rank1)
        assert user_lines(rank1, 1) == [f"r1 line {i}" for i in range(1, LINES + 1)]
        # What Docker holds from the restart line on is exactly the new run's log.
        expected = logs[1].result()
        start = next(i for i, (_, text) in enumerate(expected) if text == rank1[0][1])
        assert rank1 == expected[start:]
        # Rank 0's follower was handed over at its marker: its two runs are the whole log.
        assert persisted(job, 1, 0) + persisted(job, 2, 0) == logs[0].result()
    finally:
        if not ended(job):
            stop.request_terminate(job.id)
            stop.stop_job(job.id)
        for thread in threads:
            thread.join(30)


def test_a_process_restart_whose_new_run_ends_at_once_completes(demo, worker):
    """The launcher also polls for the decision, so a very short new run may end the container
    before the supervisor's signal reaches it: the restart still counts as delivered. (That
    interleaving depends on timing – seen in full-suite runs, not forced here; the jobs here
    prove the short-restart path completes either way.)"""
    from jobs.models import Phase, TrainingJob
    from tests.helpers import submit_job, wait_for

    for n in range(3):
        job = submit_job(
            demo,
            name=f"short-{n}",
            fault_tolerance=True,
            max_restarts=1,
            command='echo "attempt $MA_ATTEMPT"; [ "$MA_ATTEMPT" -ge 2 ] || kill -9 $$; echo done',
        )
        wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=60, message="the job to end")
        job.refresh_from_db()
        assert (job.phase, job.restarts_used) == (Phase.COMPLETED, 1), job.phase_reason


# Rank 1 prints until it is stopped, and says so on SIGTERM. Rank 0 fails once the test has seen
# both instances running and touches /tmp/go in its container: a rank 0 that failed a second after
# its start could end before a busy machine's start of rank 1 was recorded, and "both running" was
# never seen.
RANK_0_FAILS_ON_GO = (
    'if [ "$RANK" = 0 ]; then while [ ! -e /tmp/go ]; do sleep 0.1; done; echo "r0 failing"; exit 1; fi; '
    "trap 'echo \"r1 stopped\"; exit 143' TERM; "
    'i=0; while true; do i=$((i+1)); echo "r1 line $i"; sleep 0.1 & wait $!; done'
)


def test_a_worker_killed_before_it_stopped_the_other_instance_loses_none_of_it(
    demo, worker, docker_client, monkeypatch
):
    """Rank 0 fails and the job fails (no fault tolerance); the worker that decided dies before it
    stops rank 1 (CONSOLE_CRASH_AT), with rank 1's follower. Before, rank 1 ran on for good: no
    worker adopts an instance of an ended attempt, and the orphan scan skips a running one. Now
    the next worker adopts it, does the stop the decision did not, and persists every line rank 1
    wrote, its last one on SIGTERM included; then the container is removed."""
    with worker_dying_at(worker, monkeypatch, "before-stopping-the-attempt") as wait_for_its_death:
        job = make_job(demo, RANK_0_FAILS_ON_GO, fault_tolerance=False)
        logs = follow_containers(job, 1)
        container_0 = docker_client.containers.get(runs_of(job, 1)[0].container_id)
        assert container_0.exec_run(["touch", "/tmp/go"]).exit_code == 0
        wait_for_its_death()
        assert ended(job) and job.phase == Phase.FAILED, job.phase  # decided before it died
    runs = runs_of(job, 1)

    def rank_1_followed_to_its_end() -> bool:
        run = TaskRun.objects.get(id=runs[1].id)
        return run.state != TaskRun.State.RUNNING and run.follower_token is None

    try:
        wait_for(rank_1_followed_to_its_end, timeout=60, message="rank 1 stopped and followed to its end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{describe()}") from None
    expected = logs[1].result()
    assert persisted(job, 1, 1) == expected
    assert expected[-1][1] == "r1 stopped"
    assert TaskRun.objects.get(id=runs[1].id).exit_code == 143
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"id": runs[1].container_id}),
        timeout=30,
        message="rank 1's container removed",
    )


def test_an_instance_followed_elsewhere_is_stopped_when_the_deciding_worker_died(
    demo, worker, second_worker, docker_client, monkeypatch
):
    """Rank 0 is followed by the first worker, rank 1 by a second one. Rank 0 fails, the job fails
    (no fault tolerance), and the first worker dies between its decision and its stop of rank 1
    (CONSOLE_CRASH_AT). Rank 1's follower lives on in the second worker, so no pool adopts it:
    before, rank 1 ran on for good under a Failed job. Now reconcile (the first worker's beat,
    back) stops what outlived its attempt, and the second worker's follower records the end and
    persists every line rank 1 wrote, its last one on SIGTERM included."""
    monkeypatch.setenv("CONSOLE_FOLLOWERS_PER_PROCESS", "1")  # the first worker follows rank 0 only
    with worker_dying_at(worker, monkeypatch, "before-stopping-the-attempt") as wait_for_its_death:
        monkeypatch.delenv("CONSOLE_FOLLOWERS_PER_PROCESS")
        job = make_job(demo, RANK_0_FAILS_ON_GO, fault_tolerance=False)
        logs = follow_containers(job, 1)
        runs = runs_of(job, 1)
        rank_0_token = wait_for(lambda: TaskRun.objects.get(id=runs[0].id).follower_token, message="rank 0 followed")
        second_worker.start()
        rank_1_token = wait_for(
            lambda: TaskRun.objects.get(id=runs[1].id).follower_token, timeout=30, message="rank 1 followed"
        )
        assert TaskRun.objects.get(id=runs[0].id).follower_token == rank_0_token  # still the first worker's
        container_0 = docker_client.containers.get(runs[0].container_id)
        assert container_0.exec_run(["touch", "/tmp/go"]).exit_code == 0
        wait_for_its_death()
        assert ended(job) and job.phase == Phase.FAILED, job.phase  # decided before it died
    assert TaskRun.objects.get(id=runs[1].id).state == TaskRun.State.RUNNING  # the stop was lost

    followers_of_rank_1 = set()

    def rank_1_followed_to_its_end() -> bool:
        run = TaskRun.objects.get(id=runs[1].id)
        followers_of_rank_1.add(run.follower_token)
        return run.state != TaskRun.State.RUNNING and run.follower_token is None

    try:
        wait_for(rank_1_followed_to_its_end, timeout=60, message="rank 1 stopped and followed to its end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{describe()}") from None
    assert followers_of_rank_1 == {rank_1_token, None}  # the second worker's follower, to the end
    expected = logs[1].result()
    assert persisted(job, 1, 1) == expected
    assert expected[-1][1] == "r1 stopped"
    run_1 = TaskRun.objects.get(id=runs[1].id)
    assert (run_1.state, run_1.exit_code) == (TaskRun.State.EXITED, 143)
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job.id}"}),
        timeout=30,
        message="both containers removed",
    )
