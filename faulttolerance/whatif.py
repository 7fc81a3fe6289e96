""" "What happens if": for each kind of failure, what a job's high-availability settings will do,
computed by the same functions that decide at run time (policy.decide, then policy.escalate),
failure after failure of that kind, until the job ends or the settings would restart it forever
(shown up to a bound). Pure; the wizard's high-availability step and the job page show it.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import classify as c
from .policy import Counters, Policy, decide, escalate

# The failures a user asks about, in the words of the console's pages.
SCENARIOS = (
    (c.USER_ERROR, "Your code fails (exit 1, a bug)"),
    (c.RESOURCE_ERROR, "Out of memory (OOM-killed)"),
    (c.TRANSIENT, "NCCL timeout or a process killed from outside"),
    (c.HANG, "The job hangs (no log, no CPU/GPU use)"),
    (c.NODE_FAILURE, "Its Docker host is lost"),
    (c.ENV_CHECK_FAILED, "The environment check fails"),
)
SIMULATED = 200  # failures in a row looked at: more than R (<= 128) + the hang and P allowances


@dataclass(frozen=True)
class Step:
    level: str  # "process", "container", "job", "reschedule"
    consumes: str  # what this restart uses up


@dataclass(frozen=True)
class Outcome:
    failure_class: str
    label: str
    restarts: tuple[Step, ...]  # the restarts, failure after failure, before the job ends
    ends: str  # why the job then ends ("" when it never ends by the settings within SIMULATED)

    @property
    def first(self) -> Step | None:
        return self.restarts[0] if self.restarts else None

    @property
    def levels(self) -> str:
        """The restart levels in order, runs of the same level collapsed: "process → container × 2"."""
        runs: list[list] = []
        for step in self.restarts:
            if runs and runs[-1][0] == step.level:
                runs[-1][1] += 1
            else:
                runs.append([step.level, 1])
        return " → ".join(level if n == 1 else f"{level} × {n}" for level, n in runs)

    @property
    def uses(self) -> str:
        """What the restarts use up, in order, runs collapsed: "a hang restart × 3 → 1 of 3 restarts × 3"."""
        runs: list[list] = []
        for step in self.restarts:
            if runs and runs[-1][0] == step.consumes:
                runs[-1][1] += 1
            else:
                runs.append([step.consumes, 1])
        return " → ".join(what if n == 1 else f"{what} × {n}" for what, n in runs)


def _consumed(before: Counters, after: Counters, max_restarts: int, pod_retry_num: int) -> str:
    if after.restarts_used > before.restarts_used:
        return f"1 of {max_restarts} restarts"
    if after.hang_restarts_used > before.hang_restarts_used:
        return "a hang restart (not counted in max restarts)"
    if after.reschedules_used > before.reschedules_used:
        return f"1 of {pod_retry_num} instance reschedulings"
    return "nothing"


def outcome(policy: Policy, failure_class: str, label: str = "", *, multi_instance: bool = False) -> Outcome:
    """What happens when every attempt fails this way, one after the other (none ran for the
    stable window): each restart's level and what it uses up, then why the job ends."""
    counters, previous = Counters(), "initial"
    restarts: list[Step] = []
    for _ in range(SIMULATED):
        decision = decide(policy, counters, failure_class, multi_instance=multi_instance)
        # A hang or a transient failure leaves the containers alive (process level first); a
        # lost host or a failed environment check does not.
        alive = failure_class in (c.HANG, c.TRANSIENT)
        decision = escalate(decision, failure_class, previous_level=previous, stable=False, all_alive=alive)
        if not decision.restart:
            return Outcome(failure_class, label, tuple(restarts), decision.reason)
        restarts.append(
            Step(decision.level, _consumed(counters, decision.counters, policy.max_restarts, policy.pod_retry_num))
        )
        counters, previous = decision.counters, decision.level
    return Outcome(failure_class, label, tuple(restarts), "")


def what_happens(policy: Policy, *, multi_instance: bool = False) -> list[Outcome]:
    return [outcome(policy, cls, label, multi_instance=multi_instance) for cls, label in SCENARIOS]
