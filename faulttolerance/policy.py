"""The restart decision of SPEC §4, as a pure function of counters and class.

Kept free of Django and Docker so each rule of the contract is a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import classify as c

MAX_CONSECUTIVE_UNCONDITIONAL = 3
MAX_CONSECUTIVE_HANG = 3


@dataclass(frozen=True)
class Policy:
    max_restarts: int  # R; 0 = fault tolerance off
    unconditional: bool = False  # U
    hang_restart: bool = False  # H
    pod_retry_num: int = 0  # P


@dataclass(frozen=True)
class Counters:
    restarts_used: int = 0
    hang_restarts_used: int = 0
    consecutive_unconditional: int = 0
    consecutive_hang: int = 0
    reschedules_used: int = 0


@dataclass(frozen=True)
class Decision:
    restart: bool
    level: str  # "process", "container", "job", "reschedule" or "" when the job ends
    reason: str
    counters: Counters

    @property
    def summary(self) -> str:
        return f"restart ({self.level} level): {self.reason}" if self.restart else f"end: {self.reason}"


def level_for(failure_class: str) -> str:
    if failure_class == c.HANG:
        return "process"
    if failure_class in (c.ENV_CHECK_FAILED, c.NODE_FAILURE):
        return "job"
    return "container"


def decide(
    policy: Policy, counters: Counters, failure_class: str, *, stable: bool = False, multi_instance: bool = False
) -> Decision:
    """Decide what happens after an attempt ended with failure_class.

    stable: the attempt ran healthy for the stable window, which resets the
    "consecutive" counters before deciding. multi_instance: the job has more
    than one instance, so a lost host can move just the instance it ran.
    """
    if stable:
        counters = replace(counters, consecutive_unconditional=0, consecutive_hang=0)
    r = policy.max_restarts
    if failure_class == c.TERMINATED:
        return Decision(False, "", "terminated by the user", counters)
    if failure_class == c.PREEMPTED:
        # Stopped by the scheduler for a higher-priority job: re-queued, consumes nothing.
        return Decision(True, "job", "preempted: re-queued (consumes nothing)", counters)
    if r == 0:
        return Decision(False, "", "fault tolerance is off", counters)
    if failure_class == c.HANG and policy.hang_restart and counters.consecutive_hang < MAX_CONSECUTIVE_HANG:
        after = replace(
            counters,
            hang_restarts_used=counters.hang_restarts_used + 1,
            consecutive_hang=counters.consecutive_hang + 1,
        )
        return Decision(True, "process", "hang restart (does not consume max restarts)", after)
    if failure_class == c.NODE_FAILURE and multi_instance and counters.reschedules_used < policy.pod_retry_num:
        after = replace(counters, reschedules_used=counters.reschedules_used + 1)
        return Decision(True, "reschedule", "instance rescheduled to another host (consumes P, not R)", after)
    if (
        policy.unconditional
        and counters.consecutive_unconditional < MAX_CONSECUTIVE_UNCONDITIONAL
        and counters.restarts_used < r
    ):
        after = replace(
            counters,
            restarts_used=counters.restarts_used + 1,
            consecutive_unconditional=counters.consecutive_unconditional + 1,
        )
        return Decision(True, level_for(failure_class), "unconditional restart", after)
    if failure_class in c.RETRYABLE and counters.restarts_used < r:
        after = replace(counters, restarts_used=counters.restarts_used + 1)
        return Decision(True, level_for(failure_class), f"{failure_class} is retryable", after)
    if counters.restarts_used >= r and (failure_class in c.RETRYABLE or policy.unconditional):
        return Decision(False, "", f"max restarts used up ({counters.restarts_used}/{r})", counters)
    if policy.unconditional:
        # Restarts are left, but unconditional restart gave up after too many in a row.
        return Decision(
            False,
            "",
            f"{failure_class} is not retryable and {MAX_CONSECUTIVE_UNCONDITIONAL} unconditional restarts in a row "
            f"did not help ({counters.restarts_used}/{r} used)",
            counters,
        )
    return Decision(False, "", f"{failure_class} is not retryable", counters)


def escalate(decision: Decision, failure_class: str, *, previous_level: str, stable: bool, all_alive: bool) -> Decision:
    """SPEC §4's levels, escalating: process -> container -> job.

    Process level is the first choice for a hang and for a first transient failure while
    every container of the attempt is still alive (all_alive); container level when the
    process level did not help (previous_level "process") or a container died; job level
    when the container level did not help (env_check_failed and node_failure start there).
    An attempt that ran for the stable window (stable) starts the ladder again.
    previous_level: the level the failed attempt was started at ("initial" for the first).
    """
    if not decision.restart or decision.level in ("job", "reschedule") or failure_class == c.HANG:
        return decision
    previous = "initial" if stable else previous_level
    if previous == "process":
        level = "container"
    elif previous == "container":
        level = "job"
    elif failure_class == c.TRANSIENT and all_alive:
        level = "process"
    else:
        level = decision.level
    if level == "process" and not all_alive:
        level = "container"
    return replace(decision, level=level)
