""" "What happens if" (faulttolerance/whatif.py): the same decide + escalate as at run time, failure
after failure, for each kind of failure — tested by table against SPEC §4's semantics."""

import pytest

from faulttolerance import classify as c
from faulttolerance.policy import MAX_CONSECUTIVE_HANG, Policy
from faulttolerance.whatif import SCENARIOS, outcome, what_happens

R3 = "1 of 3 restarts"
HANG = "a hang restart (not counted in max restarts)"


@pytest.mark.parametrize(
    "policy, failure_class, multi, levels, consumes, ends",
    [
        pytest.param(Policy(0), c.TRANSIENT, False, [], [], "fault tolerance is off", id="off"),
        pytest.param(Policy(3), c.USER_ERROR, False, [], [], "user_error is not retryable", id="bug-ends"),
        pytest.param(
            Policy(3),
            c.TRANSIENT,
            False,
            ["process", "container", "job"],
            [R3] * 3,
            "max restarts used up (3/3)",
            id="transient-escalates",
        ),
        pytest.param(
            Policy(2),
            c.NODE_FAILURE,
            False,
            ["job", "job"],
            ["1 of 2 restarts"] * 2,
            "max restarts used up (2/2)",
            id="lost-host-job-level",
        ),
        pytest.param(
            Policy(2, pod_retry_num=1),
            c.NODE_FAILURE,
            True,
            ["reschedule", "job", "job"],
            ["1 of 1 instance reschedulings", "1 of 2 restarts", "1 of 2 restarts"],
            "max restarts used up (2/2)",
            id="lost-host-rescheduled-first",
        ),
        pytest.param(
            Policy(1, hang_restart=True),
            c.HANG,
            False,
            ["process"] * MAX_CONSECUTIVE_HANG,
            [HANG] * MAX_CONSECUTIVE_HANG,
            "hang is not retryable",
            id="hang-restarts-free-3-times",
        ),
        pytest.param(
            Policy(2, unconditional=True),
            c.USER_ERROR,
            False,
            ["container", "job"],
            ["1 of 2 restarts"] * 2,
            "max restarts used up (2/2)",
            id="unconditional-restarts-a-bug",
        ),
        pytest.param(Policy(3), c.RESOURCE_ERROR, False, [], [], "resource_error is not retryable", id="oom-ends"),
    ],
)
def test_what_happens_table(policy, failure_class, multi, levels, consumes, ends):
    result = outcome(policy, failure_class, multi_instance=multi)
    assert [s.level for s in result.restarts] == levels
    assert [s.consumes for s in result.restarts] == consumes
    assert result.ends == ends


def test_every_scenario_is_shown_in_order():
    results = what_happens(Policy(3, unconditional=True))
    assert [(r.failure_class, r.label) for r in results] == list(SCENARIOS)
    assert results[2].levels == "process → container → job"


def test_levels_collapse_runs():
    assert outcome(Policy(4), c.ENV_CHECK_FAILED).levels == "job × 4"
