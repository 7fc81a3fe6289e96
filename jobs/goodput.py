"""A job's goodput from its rows (faulttolerance/goodput.py computes it): the job page's Fault
recovery tab and the API's status.goodput show the same figures."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from faulttolerance.goodput import Goodput, Recovery, goodput
from faulttolerance.models import RecoveryRecord

from .models import TrainingJob


def recovery_input(record: RecoveryRecord) -> Recovery:
    work_lost_s = (record.evidence or {}).get("work_lost_s")
    return Recovery(
        record.detected_at, record.running_again_at, float(work_lost_s) if work_lost_s is not None else None
    )


def job_goodput(
    job: TrainingJob, records: list[RecoveryRecord] | None = None, now: datetime | None = None
) -> Goodput | None:
    """Since the job's first start, to its end (or now); None when it never ran."""
    records = list(job.recoveries.all()) if records is None else records
    end = job.ended_at or now or timezone.now()
    return goodput(job.started_at, end, [recovery_input(r) for r in sorted(records, key=lambda r: r.detected_at)])


def as_dict(result: Goodput | None) -> dict | None:
    """The API's shape: seconds, and the ratio rounded to 4 places."""
    if result is None:
        return None
    return {
        "effective_training_ratio": None if result.ratio is None else round(result.ratio, 4),
        "elapsed_s": round(result.elapsed_s, 3),
        "effective_s": round(result.effective_s, 3),
        "lost_s": round(result.lost_s, 3),
    }
