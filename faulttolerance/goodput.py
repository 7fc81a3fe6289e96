"""Goodput: how much of a job's time since its first start was useful training, and what each
recovery cost. Pure (tested by table in tests/test_goodput.py); the job page and the API feed
it the job's times and its recovery records.

A recovery costs its downtime (the failure detected -> the next attempt running, or now / the
job's end when it never ran again) plus the work lost: the training time since the last
checkpoint, which the next attempt must do again (the job reports its progress and checkpoint
lines; decide.py measures it from the failed run's log). The effective training time ratio is
(time since the first start - the recoveries' costs) / time since the first start.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Recovery:
    detected_at: datetime
    running_again_at: datetime | None  # None: not (yet) running again
    work_lost_s: float | None  # None: the job reports no checkpoints


@dataclass(frozen=True)
class RecoveryCost:
    downtime_s: float
    work_lost_s: float | None

    @property
    def lost_s(self) -> float:
        return self.downtime_s + (self.work_lost_s or 0.0)


@dataclass(frozen=True)
class Goodput:
    elapsed_s: float  # since the first start, to the end (or now)
    lost_s: float  # every recovery's downtime and work lost, within elapsed_s
    costs: tuple[RecoveryCost, ...]

    @property
    def effective_s(self) -> float:
        return max(0.0, self.elapsed_s - self.lost_s)

    @property
    def ratio(self) -> float | None:
        """Effective training time / time since the first start; None before any time passed."""
        if self.elapsed_s <= 0:
            return None
        return self.effective_s / self.elapsed_s


def goodput(first_start: datetime | None, end: datetime, recoveries: list[Recovery]) -> Goodput | None:
    """The job's goodput at `end` (its end, or now); None when it never started."""
    if first_start is None:
        return None
    elapsed = max(0.0, (end - first_start).total_seconds())
    costs = []
    for r in recoveries:
        back = r.running_again_at or end
        downtime = max(0.0, (min(back, end) - max(r.detected_at, first_start)).total_seconds())
        work_lost = None if r.work_lost_s is None else max(0.0, r.work_lost_s)
        costs.append(RecoveryCost(downtime, work_lost))
    # The costs never add up to more than the time they happened in.
    lost = min(elapsed, sum(c.lost_s for c in costs))
    return Goodput(elapsed, lost, tuple(costs))
