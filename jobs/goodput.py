"""A job's goodput from its rows (faulttolerance/goodput.py computes it): the job page's Fault
recovery tab and the API's status.goodput and recoveries show the same figures."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Prefetch, QuerySet
from django.db.models.fields.json import KT
from django.utils import timezone

from faulttolerance.goodput import Goodput, Recovery, RecoveryCost, goodput
from faulttolerance.models import RecoveryRecord

from .models import TrainingJob

# The one value of a record's evidence goodput reads, taken by the query: the evidence itself may
# hold a hang's Python stacks (up to 256 KB), which a list of 50 jobs has no reason to load.
WORK_LOST = "goodput_work_lost_s"


def goodput_records(records: QuerySet[RecoveryRecord] | None = None) -> QuerySet[RecoveryRecord]:
    """Recovery records with only what goodput reads (times, and the work lost as an annotation)."""
    records = RecoveryRecord.objects.all() if records is None else records
    return records.only("id", "job_id", "detected_at", "running_again_at").annotate(
        **{WORK_LOST: KT("evidence__work_lost_s")}
    )


def prefetch_goodput_records() -> Prefetch:
    """For a page of jobs (the API list): every job's records in one query, whatever the page's size."""
    return Prefetch("recoveries", queryset=goodput_records())


def _work_lost_s(record: RecoveryRecord) -> float | None:
    if hasattr(record, WORK_LOST):
        value = getattr(record, WORK_LOST)
    else:
        value = (record.evidence or {}).get("work_lost_s")
    return float(value) if value not in (None, "") else None


def recovery_input(record: RecoveryRecord) -> Recovery:
    return Recovery(record.detected_at, record.running_again_at, _work_lost_s(record))


def job_goodput(
    job: TrainingJob, records: list[RecoveryRecord] | None = None, now: datetime | None = None
) -> Goodput | None:
    """Since the job's first start, to its end (or now); None when it never ran. `records`: the
    job's recovery records when the caller has them (else read: prefetched ones, or one query)."""
    if job.started_at is None:
        return None  # no query: a job that never started (or an unsaved one) has nothing to count
    if records is None:
        prefetched = getattr(job, "_prefetched_objects_cache", {})
        records = (
            list(prefetched["recoveries"]) if "recoveries" in prefetched else list(goodput_records(job.recoveries))
        )
    end = job.ended_at or now or timezone.now()
    return goodput(job.started_at, end, [recovery_input(r) for r in sorted(records, key=lambda r: r.detected_at)])


def recovery_costs(result: Goodput | None, records: list[RecoveryRecord]) -> dict[int, RecoveryCost]:
    """Each record's cost (by record id), as job_goodput counted it from the same records."""
    if result is None:
        return {}
    ordered = sorted(records, key=lambda r: r.detected_at)
    return {record.id: cost for record, cost in zip(ordered, result.costs, strict=True)}


def as_dict(result: Goodput | None) -> dict | None:
    """The API's shape (status.goodput): seconds, and the ratio rounded to 4 places."""
    if result is None:
        return None
    return {
        "effective_training_ratio": None if result.ratio is None else round(result.ratio, 4),
        "elapsed_s": round(result.elapsed_s, 3),
        "effective_s": round(result.effective_s, 3),
        "lost_s": round(result.lost_s, 3),
        "recoveries": len(result.costs),
    }


def cost_dict(cost: RecoveryCost | None) -> dict:
    """One recovery's cost as the recoveries list shows it (null: the job never started)."""
    if cost is None:
        return {"work_lost_s": None, "lost_s": None}
    return {
        "work_lost_s": None if cost.work_lost_s is None else round(cost.work_lost_s, 3),
        "lost_s": round(cost.lost_s, 3),
    }
