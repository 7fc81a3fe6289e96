"""The "What happens if" table of the wizard's high-availability step and of the job page, from
a job or from the wizard's values as they stand (faulttolerance/whatif.py computes it)."""

from __future__ import annotations

from collections.abc import Mapping

from faulttolerance.policy import Policy
from faulttolerance.whatif import Outcome, what_happens

from . import labels, stored_text
from . import validators as v
from .models import TrainingJob


def for_job(job: TrainingJob) -> list[Outcome]:
    policy = Policy(job.max_restarts_effective, job.unconditional_restart, job.hang_restart, job.pod_retry_num)
    return what_happens(policy, multi_instance=job.node_count > 1)


def _number(data: Mapping, name: str, default: int, low: int, high: int) -> int:
    try:
        return min(high, max(low, int(data.get(name) or default)))
    except (TypeError, ValueError):
        return default


def _on(data: Mapping, name: str) -> bool:
    return str(data.get(name, "")).lower() in ("on", "true", "1")


def for_form_data(data: Mapping) -> list[Outcome]:
    """From the wizard's posted values, valid or not yet (a number being typed counts as its
    nearest allowed value): the table follows the switches as the user sets them."""
    max_restarts = _number(data, "max_restarts", 3, v.MAX_RESTARTS_MIN, v.MAX_RESTARTS_MAX)
    policy = Policy(
        max_restarts if _on(data, "fault_tolerance") else 0,
        _on(data, "unconditional_restart"),
        _on(data, "hang_restart"),
        _number(data, "pod_retry_num", 0, 0, v.POD_RETRY_MAX),
    )
    return what_happens(policy, multi_instance=_number(data, "node_count", 1, 1, 10**6) > 1)


# -- in the page's language (faulttolerance/ is pure Python and speaks English) ---------------------
def _runs(items: list[str], show) -> str:
    runs: list[list] = []
    for item in items:
        if runs and runs[-1][0] == item:
            runs[-1][1] += 1
        else:
            runs.append([item, 1])
    return " → ".join(show(item) if n == 1 else f"{show(item)} × {n}" for item, n in runs)


def levels_text(outcome: Outcome) -> str:
    """Outcome.levels with each level's label: "process → container × 2"."""
    return _runs([step.level for step in outcome.restarts], lambda level: labels.label("level", level))


def uses_text(outcome: Outcome) -> str:
    """Outcome.uses with each part translated as a stored text: "a hang restart × 3 → 1 of 3 restarts"."""
    return _runs([step.consumes for step in outcome.restarts], stored_text.translate)
