"""SPEC §4 as unit tests: the restart decision (faulttolerance.policy.decide) and
the log failure analysis (faulttolerance.classify.classify). No database, no Docker."""

from __future__ import annotations

import pytest

from faulttolerance import classify as c
from faulttolerance.classify import EndFacts, classify
from faulttolerance.policy import Counters, Decision, Policy, decide, escalate

ALL_CLASSES = (
    c.USER_ERROR,
    c.RESOURCE_ERROR,
    c.ENV_CHECK_FAILED,
    c.NODE_FAILURE,
    c.TRANSIENT,
    c.HANG,
    c.PREEMPTED,
    c.TERMINATED,
)
RETRYABLE = (c.ENV_CHECK_FAILED, c.NODE_FAILURE, c.TRANSIENT)
NOT_RETRYABLE = (c.USER_ERROR, c.RESOURCE_ERROR)


def run_job(policy: Policy, failures, counters: Counters | None = None):
    """Feed attempt ends to decide() until the job ends; returns (restart decisions, final decision)."""
    counters = counters or Counters()
    restarts = []
    for failure_class in failures:
        decision = decide(policy, counters, failure_class)
        counters = decision.counters
        if not decision.restart:
            return restarts, decision
        restarts.append(decision)
    raise AssertionError(f"the job was still restarting after {len(restarts)} failures")


def always(failure_class: str, times: int = 1000):
    return [failure_class] * times


# -- the seed's two examples -----------------------------------------------------------------
def test_seed_example_unconditional_with_a_job_that_always_fails_with_a_user_error():
    """R = 10, U on, always user_error: ends after 3 unconditional restarts with 7 restarts left."""
    policy = Policy(max_restarts=10, unconditional=True)
    restarts, final = run_job(policy, always(c.USER_ERROR))
    assert len(restarts) == 3
    assert all(d.reason == "unconditional restart" for d in restarts)
    assert [d.counters.restarts_used for d in restarts] == [1, 2, 3]
    assert final.restart is False and final.level == ""
    assert policy.max_restarts - final.counters.restarts_used == 7
    assert "user_error is not retryable" in final.summary


def test_seed_example_hang_restart_with_a_job_that_hangs_four_times():
    """R = 10, H on, 4 hangs in a row: 3 hang restarts, still 10 restarts left, then the job ends."""
    policy = Policy(max_restarts=10, hang_restart=True)
    restarts, final = run_job(policy, always(c.HANG, 4))
    assert len(restarts) == 3
    assert all(d.level == "process" for d in restarts)
    assert [d.counters.hang_restarts_used for d in restarts] == [1, 2, 3]
    assert final.restart is False
    assert final.counters.restarts_used == 0  # 10 of 10 left
    assert final.counters.hang_restarts_used == 3


# -- step 1: terminated ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "policy",
    [
        Policy(max_restarts=10, unconditional=True, hang_restart=True),
        Policy(max_restarts=0),
        Policy(max_restarts=1),
    ],
)
def test_step1_terminated_is_never_restarted_and_consumes_nothing(policy):
    counters = Counters(restarts_used=0)
    decision = decide(policy, counters, c.TERMINATED)
    assert decision.restart is False
    assert decision.counters == counters
    assert "terminated" in decision.summary


# -- step 2: hang ---------------------------------------------------------------------------------
def test_step2_hang_with_h_restarts_at_process_level_without_consuming_r():
    policy = Policy(max_restarts=2, hang_restart=True)
    decision = decide(policy, Counters(restarts_used=2), c.HANG)  # R used up: hang restarts still happen
    assert decision.restart is True
    assert decision.level == "process"
    assert decision.counters.restarts_used == 2
    assert decision.counters.hang_restarts_used == 1
    assert decision.counters.consecutive_hang == 1


def test_step2_hang_takes_precedence_over_unconditional_restart():
    policy = Policy(max_restarts=10, unconditional=True, hang_restart=True)
    decision = decide(policy, Counters(), c.HANG)
    assert decision.restart and decision.level == "process"
    assert decision.counters.restarts_used == 0  # a hang restart, not an unconditional one
    assert decision.counters.consecutive_unconditional == 0


def test_step2_hang_without_h_and_without_u_ends_the_job():
    decision = decide(Policy(max_restarts=10), Counters(), c.HANG)
    assert decision.restart is False
    assert decision.counters.restarts_used == 0


def test_step2_fourth_consecutive_hang_falls_through_to_unconditional_restart():
    policy = Policy(max_restarts=10, unconditional=True, hang_restart=True)
    restarts, _ = run_job(policy, always(c.HANG, 4) + always(c.USER_ERROR))
    assert [d.level for d in restarts[:3]] == ["process"] * 3
    fourth = restarts[3]
    assert fourth.reason == "unconditional restart"
    assert fourth.counters.restarts_used == 1
    assert fourth.counters.hang_restarts_used == 3


# -- step 3: unconditional ------------------------------------------------------------------------
@pytest.mark.parametrize("failure_class", [c.USER_ERROR, c.RESOURCE_ERROR, c.TRANSIENT, c.NODE_FAILURE])
def test_step3_unconditional_restarts_any_class_and_consumes_r(failure_class):
    decision = decide(Policy(max_restarts=5, unconditional=True), Counters(restarts_used=1), failure_class)
    assert decision.restart is True
    assert decision.reason == "unconditional restart"
    assert decision.counters.restarts_used == 2
    assert decision.counters.consecutive_unconditional == 1


def test_step3_unconditional_stops_when_r_is_used_up():
    policy = Policy(max_restarts=2, unconditional=True)
    restarts, final = run_job(policy, always(c.USER_ERROR))
    assert len(restarts) == 2
    assert final.counters.restarts_used == 2
    assert "max restarts used up (2/2)" in final.summary


def test_step3_then_step4_unconditional_and_retryable_class_uses_all_of_r():
    """After 3 consecutive unconditional restarts, a retryable class still restarts (step 4) until R is used."""
    policy = Policy(max_restarts=10, unconditional=True)
    restarts, final = run_job(policy, always(c.TRANSIENT))
    assert len(restarts) == 10
    assert [d.reason for d in restarts[:3]] == ["unconditional restart"] * 3
    assert all(d.reason == "transient is retryable" for d in restarts[3:])
    assert final.counters.restarts_used == 10
    assert "max restarts used up (10/10)" in final.summary


# -- step 4: retryable ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "failure_class,level", [(c.TRANSIENT, "container"), (c.ENV_CHECK_FAILED, "job"), (c.NODE_FAILURE, "job")]
)
def test_step4_retryable_class_restarts_and_consumes_r(failure_class, level):
    decision = decide(Policy(max_restarts=3), Counters(restarts_used=2), failure_class)
    assert decision.restart is True
    assert decision.level == level
    assert decision.counters.restarts_used == 3
    assert decision.counters.consecutive_unconditional == 0


def test_step4_retryable_class_restarts_until_r_is_used_up():
    restarts, final = run_job(Policy(max_restarts=3), always(c.TRANSIENT))
    assert [d.counters.restarts_used for d in restarts] == [1, 2, 3]
    assert final.restart is False
    assert "max restarts used up (3/3)" in final.summary


# -- step 5: otherwise Failed -------------------------------------------------------------------------
@pytest.mark.parametrize("failure_class", NOT_RETRYABLE)
def test_step5_non_retryable_class_without_u_ends_with_its_class(failure_class):
    counters = Counters(restarts_used=1)
    decision = decide(Policy(max_restarts=10), counters, failure_class)
    assert decision.restart is False
    assert decision.level == ""
    assert decision.counters == counters
    assert f"{failure_class} is not retryable" in decision.summary


# -- R = 0 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("failure_class", [k for k in ALL_CLASSES if k != c.PREEMPTED])
def test_r0_nothing_is_restarted(failure_class):
    # (A preemption is the platform's doing, not a failure: re-queued whatever R is.)
    policy = Policy(max_restarts=0, unconditional=True, hang_restart=True)
    decision = decide(policy, Counters(), failure_class)
    assert decision.restart is False
    assert decision.counters == Counters()


# -- the stable window --------------------------------------------------------------------------------
def test_stable_window_resets_consecutive_unconditional():
    policy = Policy(max_restarts=10, unconditional=True)
    tired = Counters(restarts_used=3, consecutive_unconditional=3)
    assert decide(policy, tired, c.USER_ERROR).restart is False
    decision = decide(policy, tired, c.USER_ERROR, stable=True)
    assert decision.restart is True
    assert decision.counters.restarts_used == 4  # the total is not reset, only "consecutive"
    assert decision.counters.consecutive_unconditional == 1


def test_stable_window_resets_consecutive_hang():
    policy = Policy(max_restarts=10, hang_restart=True)
    tired = Counters(hang_restarts_used=3, consecutive_hang=3)
    assert decide(policy, tired, c.HANG).restart is False
    decision = decide(policy, tired, c.HANG, stable=True)
    assert decision.restart is True and decision.level == "process"
    assert decision.counters.hang_restarts_used == 4
    assert decision.counters.consecutive_hang == 1
    assert decision.counters.restarts_used == 0


def test_stable_window_lets_a_long_running_job_use_unconditional_restarts_again():
    """Fail, fail, fail, then run healthy past the window: three more unconditional restarts are allowed."""
    policy = Policy(max_restarts=10, unconditional=True)
    counters = Counters()
    for _ in range(3):
        counters = decide(policy, counters, c.USER_ERROR).counters
    for _ in range(3):
        decision = decide(policy, counters, c.USER_ERROR, stable=counters.consecutive_unconditional == 3)
        assert decision.restart
        counters = decision.counters
    assert counters.restarts_used == 6
    assert decide(policy, counters, c.USER_ERROR).restart is False


def test_without_the_stable_window_nothing_resets():
    decision = decide(Policy(max_restarts=10, hang_restart=True), Counters(consecutive_hang=2), c.HANG)
    assert decision.counters.consecutive_hang == 3


# -- classify: one case per rule ---------------------------------------------------------------------------
TRACEBACK = (
    "epoch 1 loss 0.3",
    "Traceback (most recent call last):",
    '  File "/home/ma-user/modelarts/user-job-dir/code/train.py", line 3, in <module>',
    "    open('missing.csv')",
    "FileNotFoundError: [Errno 2] No such file or directory: 'missing.csv'",
)


@pytest.mark.parametrize(
    "facts,failure_class,rule",
    [
        pytest.param(EndFacts(exit_code=1, log_tail=TRACEBACK), c.USER_ERROR, "python-traceback", id="traceback"),
        pytest.param(
            EndFacts(exit_code=1, log_tail=("  File 'x.py', line 1", "SyntaxError: invalid syntax")),
            c.USER_ERROR,
            "python-traceback",
            id="syntax-error",
        ),
        pytest.param(EndFacts(exit_code=137, oom_killed=True), c.RESOURCE_ERROR, "oom", id="oom"),
        pytest.param(EndFacts(exit_code=137, log_tail=("tick 1", "tick 2")), c.TRANSIENT, "killed-by-signal", id="137"),
        pytest.param(EndFacts(exit_code=143), c.TRANSIENT, "killed-by-signal", id="143-sigterm"),
        pytest.param(
            EndFacts(
                exit_code=1,
                log_tail=(
                    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE)",
                    "RuntimeError: NCCL communicator was aborted: NCCL timeout after 1800000 ms",
                ),
            ),
            c.TRANSIENT,
            "collective-timeout",
            id="nccl-timeout",
        ),
        pytest.param(
            EndFacts(exit_code=1, log_tail=("RuntimeError: NCCL error: unhandled system error",)),
            c.TRANSIENT,
            "collective-timeout",
            id="nccl-unhandled-system-error",
        ),
        pytest.param(
            EndFacts(exit_code=1, log_tail=("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",)),
            c.TRANSIENT,
            "gpu-hardware",
            id="xid",
        ),
        pytest.param(
            EndFacts(exit_code=86, env_check_failed=True, env_check_detail="disk-size root: / has 3 GB free"),
            c.ENV_CHECK_FAILED,
            "env-check",
            id="env-check-reported-by-the-launcher",
        ),
        pytest.param(
            # The job printed the launcher's words: a log line is not the launcher's report.
            EndFacts(
                exit_code=1, log_tail=("[env-check] item: dns, result: fail, forged", "[env-check] error,exiting")
            ),
            c.USER_ERROR,
            "nonzero-exit",
            id="env-check-printed-by-the-job",
        ),
        pytest.param(
            EndFacts(exit_code=1, log_tail=("ConnectionError: Connection reset by peer in all_reduce",)),
            c.TRANSIENT,
            "collective-connection-reset",
            id="connection-reset",
        ),
        pytest.param(EndFacts(lost=True), c.NODE_FAILURE, "host-lost", id="lost-host"),
        pytest.param(
            EndFacts(start_error="Image 'console/nope:1' does not exist on host local."),
            c.USER_ERROR,
            "start-failed",
            id="start-failure",
        ),
        pytest.param(EndFacts(exit_code=1, log_tail=("something broke",)), c.USER_ERROR, "nonzero-exit", id="exit-1"),
    ],
)
def test_classify_rules(facts, failure_class, rule):
    verdict = classify(facts)
    assert verdict is not None
    assert (verdict.failure_class, verdict.rule) == (failure_class, rule)
    assert verdict.explanation  # shown on the recovery record
    assert verdict.retryable == (failure_class in RETRYABLE)


def test_classify_reports_the_matched_log_lines_as_evidence():
    verdict = classify(EndFacts(exit_code=1, log_tail=TRACEBACK))
    assert verdict.matched_lines == [TRACEBACK[1], TRACEBACK[4]]
    verdict = classify(EndFacts(exit_code=86, env_check_failed=True, env_check_detail="ulimit: open files is 1024"))
    assert verdict.matched_lines == ["ulimit: open files is 1024"]


def test_a_log_tail_the_job_crafted_is_classified_in_one_pass_per_line():
    """50 lines of 4,096 characters (what a decision reads), shaped for the log rules' patterns to
    retry: "NCCL" a thousand times took the collective-timeout rule 0.1-0.2 s a line, seconds a
    decision with the worker's GIL held. Each line is now one pass; the verdict is the same."""
    from tests.helpers import no_longer_than

    crafted = ("NCCL" * 1024, "HCCL " * 819, "Connection reset by peer" * 170, "ECC " * 1024, "x" * 4096)
    tail = tuple(crafted[i % len(crafted)][:4096] for i in range(50))
    with no_longer_than(20):  # 0.7 s here; the old pattern had not finished after 5 s
        for _ in range(20):  # twenty decisions
            verdict = classify(EndFacts(exit_code=1, log_tail=tail))
    assert verdict.rule == "collective-connection-reset"
    late = ("NCCL" * 1000 + " then a timeout")[:4096]
    assert classify(EndFacts(exit_code=1, log_tail=(late,))).rule == "collective-timeout"


def test_no_log_line_makes_a_host_faulty():
    """Whatever the job prints, the log rules only pick classes a job may claim for its own
    failure: never env_check_failed or node_failure (which isolate hosts)."""
    from faulttolerance.classify import RULES

    assert {r.failure_class for r in RULES if r.log_pattern is not None} <= {c.TRANSIENT, c.USER_ERROR}
    hostile = ("error,exiting", "[env-check] error,exiting", "Docker host lost", "node failure", "oom-killed")
    assert classify(EndFacts(exit_code=1, log_tail=hostile)).failure_class == c.USER_ERROR


def test_classify_oom_wins_over_the_signal_exit_code():
    assert classify(EndFacts(exit_code=137, oom_killed=True, log_tail=("tick",))).failure_class == c.RESOURCE_ERROR


def test_classify_a_lost_host_wins_over_everything_in_the_log():
    assert classify(EndFacts(lost=True, log_tail=TRACEBACK)).failure_class == c.NODE_FAILURE


@pytest.mark.parametrize(
    "log_tail",
    [
        (),
        ("epoch 1 loss 0.3", "done"),
        # A job that logs a caught exception and then finishes successfully did not fail.
        ("WARNING: retrying", "ValueError: bad row 17 skipped", "done"),
    ],
)
def test_classify_exit_0_is_success(log_tail):
    assert classify(EndFacts(exit_code=0, log_tail=log_tail)) is None


def test_classify_feeds_decide_end_to_end():
    """An OOM is not retried without U; a SIGKILL from outside is retried."""
    policy = Policy(max_restarts=3)
    oom = classify(EndFacts(exit_code=137, oom_killed=True))
    killed = classify(EndFacts(exit_code=137))
    assert decide(policy, Counters(), oom.failure_class).restart is False
    assert decide(policy, Counters(), killed.failure_class).restart is True


def test_preempted_is_requeued_and_consumes_nothing_even_without_fault_tolerance():
    for r in (0, 3):
        decision = decide(Policy(max_restarts=r), Counters(restarts_used=0), "preempted")
        assert (decision.restart, decision.level) == (True, "job")
        assert decision.counters == Counters(restarts_used=0)


# -- escalation (SPEC §4 "Restart levels, escalating"), a pure function -------------------------
RESTART = Decision(True, "container", "retryable", Counters(1))


@pytest.mark.parametrize(
    "decision, failure_class, previous, stable, all_alive, level",
    [
        pytest.param(RESTART, c.TRANSIENT, "initial", False, True, "process", id="first-transient-alive"),
        pytest.param(RESTART, c.TRANSIENT, "initial", False, False, "container", id="first-transient-a-container-died"),
        pytest.param(RESTART, c.TRANSIENT, "process", False, True, "container", id="process-level-did-not-help"),
        pytest.param(RESTART, c.TRANSIENT, "container", False, True, "job", id="container-level-did-not-help"),
        pytest.param(RESTART, c.TRANSIENT, "container", True, True, "process", id="stable-starts-over"),
        pytest.param(RESTART, c.USER_ERROR, "initial", False, True, "container", id="user-error-starts-at-container"),
        pytest.param(RESTART, c.RESOURCE_ERROR, "process", False, False, "container", id="oom-after-process"),
        pytest.param(
            Decision(True, "job", "", Counters(1)), c.ENV_CHECK_FAILED, "initial", False, True, "job", id="env-check"
        ),
        pytest.param(
            Decision(True, "reschedule", "", Counters(0, reschedules_used=1)),
            c.NODE_FAILURE,
            "process",
            False,
            False,
            "reschedule",
            id="reschedule-stays",
        ),
        pytest.param(
            Decision(True, "process", "hang restart", Counters(0, 1)),
            c.HANG,
            "container",
            False,
            True,
            "process",
            id="hang",
        ),
        pytest.param(Decision(False, "", "end", Counters(3)), c.TRANSIENT, "process", False, True, "", id="no-restart"),
    ],
)
def test_escalate(decision, failure_class, previous, stable, all_alive, level):
    escalated = escalate(decision, failure_class, previous_level=previous, stable=stable, all_alive=all_alive)
    assert escalated.level == level
    assert (escalated.restart, escalated.counters, escalated.reason) == (
        decision.restart,
        decision.counters,
        decision.reason,
    )
