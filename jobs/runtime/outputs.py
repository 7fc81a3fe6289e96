"""What a job leaves behind once it ended (SPEC §3 "storage" and "more settings").

- Auto-publish: a job that completed publishes its artifacts as a model version, once: V1 of
  a new model, or the next version of the model the user chose.
- Keep logs permanently: the log of every instance (all attempts, in order) is exported to
  `<log path>/<job name>-<job id>/worker-<index>.log` in object storage.
- Otherwise the logs persisted by the console are deleted `log_retention_s()` after the end
  (30 days by default).
- Log downloads, of the whole log or of a time range where the job allows it.

Every step takes a job id, re-reads the database and is safe to run twice or concurrently:
stop.finish() queues `jobs.tasks.job_outputs` after commit, and reconcile steps find the
jobs whose step was lost (complete_job_outputs) or whose logs are due (delete_expired_logs).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs import events, storage
from jobs.models import FINAL_PHASES, RETAINED_PHASES, EventKind, Phase, TaskRun, TrainingJob

from . import hostpaths
from .lifecycle import announce
from .logrecords import LogLine, iter_raw, iter_records, offset_of_time
from .logs import log_path

log = logging.getLogger(__name__)

ENDED_PHASES = FINAL_PHASES | RETAINED_PHASES
# Only a job that completed publishes its model (SPEC §3: the *final* model); a retained one
# has completed too, it only keeps its containers a while longer.
PUBLISHABLE_PHASES = {Phase.COMPLETED, Phase.COMPLETED_RETAINED}
DEFAULT_LOG_RETENTION_S = 30 * 86400
TIME_RANGE_SETTING = "log_time_range_download"


# -- settings ----------------------------------------------------------------------------------------
def log_retention_s() -> float:
    """How long the logs of a job that does not keep them stay after its end: the setting
    LOG_RETENTION_S, else the environment variable CONSOLE_LOG_RETENTION_S, else 30 days."""
    configured = getattr(settings, "LOG_RETENTION_S", None)
    if configured is None:
        configured = os.environ.get("CONSOLE_LOG_RETENTION_S") or DEFAULT_LOG_RETENTION_S
    return float(configured)


def duration_text(seconds: float) -> str:
    """30 days, 1 day, 6 hours, 5 seconds: the largest whole unit."""
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"


def keeps_logs(job: TrainingJob) -> bool:
    """Keep logs permanently, resolved: an empty setting is on for NPU flavors and when a log
    path is given (SPEC §3); clean() stores the resolved value, this covers rows it did not see."""
    if job.keep_logs is not None:
        return job.keep_logs
    return bool(job.log_export_path) or bool(job.flavor_id and job.flavor.npu)


def keeps_logs_q() -> Q:
    """keeps_logs() as a query."""
    resolved_on = Q(keep_logs__isnull=True) & (~Q(log_export_path="") | Q(flavor__npu=True))
    return Q(keep_logs=True) | resolved_on


def drops_logs_q() -> Q:
    """Not keeps_logs(), as a query (spelt out: negating a nullable join also drops rows without a flavor)."""
    resolved_off = Q(keep_logs__isnull=True, log_export_path="") & (Q(flavor__isnull=True) | Q(flavor__npu=False))
    return Q(keep_logs=False) | resolved_off


def export_url(job: TrainingJob) -> str:
    """The folder of the job's exported logs: one folder per job, so two jobs of the same name
    (or the same job's reruns under a new id) never overwrite each other's logs."""
    return f"{job.log_export_path.rstrip('/')}/{job.name}-{job.id}/"


# -- the step that runs when a job ended -------------------------------------------------------------
def complete_outputs(job_id) -> bool:
    """Publish the final model and export the logs of an ended job, each once. Returns whether
    it did anything."""
    published = publish(job_id)
    exported = export_logs(job_id)
    return published or exported


def publish(job_id) -> bool:
    """Auto-publish a completed job's artifacts as a model version, exactly once."""
    with transaction.atomic():
        # The claim is one conditional UPDATE: a second worker (or a re-run) updates nothing.
        # It holds the job's row until the version exists, so should this worker die half-way
        # the claim rolls back with the rest and reconcile tries again.
        claimed = TrainingJob.objects.filter(
            id=job_id, auto_publish=True, publish_checked_at__isnull=True, phase__in=PUBLISHABLE_PHASES
        ).update(publish_checked_at=timezone.now())
        if not claimed:
            return False
        job = TrainingJob.objects.select_related("publish_model").get(id=job_id)
        if note := _why_not_publishable(job):
            TrainingJob.objects.filter(id=job_id).update(publish_note=note)
            events.record(job, EventKind.MODEL_NOT_PUBLISHED, f"Model not published: {note}")
        else:
            version = job.publish_final_model()
            TrainingJob.objects.filter(id=job_id).update(published_version=version)
            events.record(
                job,
                EventKind.MODEL_PUBLISHED,
                f"Model published: {version.model.name} {version.label}",
                model=version.model.name,
                version=version.label,
                artifact_path=version.artifact_path,
            )
        announce(job_id)
    return True


def _why_not_publishable(job: TrainingJob) -> str:
    """Why there is nothing to publish ('' when there is): the form refuses most of these at
    submission; what remains is what changed since (the chosen model deleted, no artifact)."""
    if not job.store_artifacts or not job.artifact_path:
        return "store artifacts is off, so the job has no artifacts to publish."
    if job.publish_as == TrainingJob.PublishAs.VERSION and not job.publish_model_id:
        return "the model to publish a new version of no longer exists."
    if job.publish_as == TrainingJob.PublishAs.NEW and not job.model_name:
        return "no model name was given."
    try:
        usage = storage.measure(job.artifact_path, stop_after_files=1)
    except storage.StorageError as exc:
        return f"the artifact folder cannot be read: {exc}"
    if usage.files == 0:
        # An empty model version would look like a result; saying why is more useful.
        return f"the artifact folder {job.artifact_path} is empty."
    return ""


def export_logs(job_id) -> bool:
    """Write the log of every instance of an ended job that keeps its logs to its log path;
    writes whole files (a re-run rewrites the same content), marks the job once."""
    job = (
        TrainingJob.objects.select_related("flavor")
        .filter(id=job_id, phase__in=ENDED_PHASES, logs_exported_at__isnull=True)
        .first()
    )
    if job is None or not keeps_logs(job):
        return False
    if _followers_active(job.id):
        return False  # an instance's last lines are still being written; reconcile comes back
    error = ""
    files = 0
    try:
        files = _write_export(job)
    except (storage.StorageError, OSError) as exc:
        # The logs stay in the console (retention never deletes a job that keeps its logs),
        # so giving up loses nothing; the page and the API say why.
        error = f"Log export to {job.log_export_path or '(no log path)'} failed: {exc}"
        log.warning("job %s: %s", job.id, error)
    with transaction.atomic():
        marked = TrainingJob.objects.filter(id=job.id, logs_exported_at__isnull=True).update(
            logs_exported_at=timezone.now(), logs_export_error=error
        )
        if marked:
            if error:
                events.record(job, EventKind.LOGS_EXPORT_FAILED, f"{error} The logs stay in the console.")
            elif files:
                url = export_url(job)
                events.record(job, EventKind.LOGS_EXPORTED, f"Logs exported to {url}", path=url, files=files)
            announce(job.id)
    return bool(marked)


def _followers_active(job_id) -> bool:
    stale = timezone.now() - timedelta(seconds=settings.FOLLOWER_STALE_AFTER_S)
    return TaskRun.objects.filter(
        attempt__job_id=job_id, follower_token__isnull=False, follower_heartbeat__gte=stale
    ).exists()


def _write_export(job: TrainingJob) -> int:
    if not job.log_export_path:
        raise storage.StorageError("no log path is set.")
    url = export_url(job)
    if not storage.bucket_exists(url):
        raise storage.StorageError(f"the bucket of '{url}' does not exist.")
    indexes = sorted(set(TaskRun.objects.filter(attempt__job=job).values_list("index", flat=True)))
    if not indexes:
        return 0  # stopped before it started: no log, no folder
    # The log path is in a bucket jobs may write: the folders are opened without following links
    # (a planted link is refused with a StorageError naming it), and each file is written
    # whole or not at all, into a new file renamed over the old one (never through a link).
    with storage.open_folder(url, create=True) as folder:
        for index in indexes:
            hostpaths.write_file(folder, f"worker-{index}.log", instance_log(job, index), mode=0o644)
    return len(indexes)


def delete_logs(job_id) -> bool:
    """Delete the persisted logs of an ended job that does not keep them (the reconcile step
    decides when: log_retention_s() after the end). Files first, then the mark: a worker
    that dies between the two leaves a job the next run finishes."""
    job = (
        TrainingJob.objects.select_related("flavor")
        .filter(id=job_id, phase__in=ENDED_PHASES, logs_deleted_at__isnull=True)
        .first()
    )
    if job is None or keeps_logs(job):
        return False
    shutil.rmtree(Path(settings.LOG_ROOT) / str(job.id), ignore_errors=True)  # log_path()'s folder
    with transaction.atomic():
        marked = TrainingJob.objects.filter(id=job.id, logs_deleted_at__isnull=True).update(
            logs_deleted_at=timezone.now()
        )
        if marked:
            events.record(
                job,
                EventKind.LOGS_DELETED,
                f"Logs deleted by retention, {duration_text(log_retention_s())} after the job ended "
                "(keep logs permanently is off).",
            )
            announce(job.id)
    return bool(marked)


# -- reading logs ---------------------------------------------------------------------------------------
def iter_log(task_run: TaskRun, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[LogLine]:
    """The acknowledged records of a task run between two times (inclusive), streamed from the
    file in blocks. Records are in time order (the follower never appends an older one), so
    reading stops at the first record after end_ns."""
    for record in iter_records(log_path(task_run), 0, task_run.log_bytes):
        if end_ns is not None and record.ts_ns > end_ns:
            return
        if start_ns is None or record.ts_ns >= start_ns:
            yield record


def raw_log(task_run: TaskRun, start_ns: int | None = None, end_ns: int | None = None) -> Iterator[bytes]:
    """Exactly the bytes the job printed (logrecords.iter_raw), whole or between two times
    (inclusive): the ends are found by a binary search over the file, the bytes streamed."""
    path, size = log_path(task_run), task_run.log_bytes
    if size <= 0:
        return
    start = 0 if start_ns is None else offset_of_time(path, start_ns, size)
    end = size if end_ns is None else offset_of_time(path, end_ns + 1, size, start)
    yield from iter_raw(path, start, end, size)


def instance_log(
    job: TrainingJob, index: int, start_ns: int | None = None, end_ns: int | None = None, separators: bool = True
) -> Iterator[bytes]:
    """The log of one instance across all attempts, as the bytes its processes printed. A
    separator line names each attempt; within a time range only attempts with output in it
    get one; a separator after output that did not end with a newline starts a line of its own."""
    runs = TaskRun.objects.filter(attempt__job=job, index=index).select_related("attempt", "host")
    ranged = start_ns is not None or end_ns is not None
    ends_line = True
    for run in runs.order_by("attempt__number"):
        host = run.host.name if run.host_id else ""
        header = f"# attempt {run.attempt.number} on {host}, container {run.container_name}\n".encode()
        first = True
        for chunk in raw_log(run, start_ns, end_ns):
            if first and separators:
                yield header if ends_line else b"\n" + header
            first = False
            ends_line = chunk.endswith(b"\n")
            yield chunk
        if first and separators and not ranged:
            yield header if ends_line else b"\n" + header
            ends_line = True


class LogRequestRefused(Exception):
    """A log download the job does not allow: status 410 (deleted) or 400 (time range)."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def deleted_message(job: TrainingJob) -> str:
    return (
        f"The logs of this job were deleted by retention on {_when(job.logs_deleted_at)}: without "
        f"keep logs permanently, logs are kept {duration_text(log_retention_s())} after the job ends."
    )


def check_log_request(job: TrainingJob, params: Mapping[str, str]) -> tuple[int | None, int | None]:
    """The time range (ns, either end may be open) a log download asks for, or why it is refused:
    the logs were deleted (410), a range on a job without log download by time range, or a
    range that is not one (400). No start_time/end_time: the whole log."""
    if job.logs_deleted_at:
        raise LogRequestRefused(410, "logs", deleted_message(job))
    raw_start = (params.get("start_time") or "").strip()
    raw_end = (params.get("end_time") or "").strip()
    if not (raw_start or raw_end):
        return None, None
    if not job.log_time_range_download:
        raise LogRequestRefused(
            400,
            TIME_RANGE_SETTING,
            f"Log download by time range is off for this job (setting {TIME_RANGE_SETTING}): "
            "download the whole log instead.",
        )
    start_ns = parse_time(raw_start, "start_time") if raw_start else None
    end_ns = parse_time(raw_end, "end_time", end=True) if raw_end else None
    if start_ns is not None and end_ns is not None and end_ns < start_ns:
        raise LogRequestRefused(400, "end_time", "end_time must not be before start_time.")
    return start_ns, end_ns


def parse_time(value: str, name: str, *, end: bool = False) -> int:
    """ISO 8601 (without an offset: the console's time zone, as the page shows times) or
    milliseconds since the epoch (as the API's create_time) -> ns since the epoch.

    Lines carry ns timestamps, a time given by hand is coarser: an end (end=True) takes in
    the whole unit it names, so "to 14:05:00" includes the lines of 14:05:00.7 and a range
    from and to one line's time as shown returns that line."""
    if value.isdigit():
        return int(value) * 1_000_000 + (999_999 if end else 0)
    try:
        moment = datetime.fromisoformat(value.replace(" ", "T", 1))
    except ValueError:
        raise LogRequestRefused(
            400,
            name,
            f"{name} must be a date and time (ISO 8601, e.g. 2026-11-29T14:05:00Z) or milliseconds "
            f"since the epoch; got '{value[:64]}'.",
        ) from None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    # Whole microseconds: exact, where float seconds would round a line's ns timestamp.
    ns = (moment - EPOCH) // timedelta(microseconds=1) * 1000
    return ns + (_unit_ns(value) - 1 if end else 0)


def _unit_ns(value: str) -> int:
    """The precision of an ISO time as written: a day, minute, second or a fraction of one."""
    clock = value.replace(" ", "T", 1).partition("T")[2]
    if not clock:
        return 86400 * 1_000_000_000
    clock = clock.rstrip("Z").split("+")[0].split("-")[0]
    if "." in clock or "," in clock:
        digits = min(len(clock.replace(",", ".").partition(".")[2]), 9)
        return 10 ** (9 - digits)
    return 1_000_000_000 if clock.count(":") >= 2 else 60_000_000_000


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _when(moment: datetime | None) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z") if moment else ""


# -- what the page and the API show -----------------------------------------------------------------------
def publish_status(job: TrainingJob) -> dict | None:
    """Auto-publish of the job: None when off; else state pending (the job has not ended),
    publishing, published (model, version) or not_published (reason)."""
    if not job.auto_publish:
        return None
    if job.published_version_id:
        version = job.published_version
        return {
            "state": "published",
            "model": version.model.name,
            "version": version.label,
            "published_at": job.publish_checked_at.isoformat() if job.publish_checked_at else None,
        }
    if job.publish_checked_at:
        return {"state": "not_published", "reason": job.publish_note}
    if job.phase in PUBLISHABLE_PHASES:
        return {"state": "publishing"}
    if job.phase in ENDED_PHASES:
        return {"state": "not_published", "reason": "the job did not complete: only a completed job publishes."}
    return {"state": "pending", "reason": "Publishes when the job completes."}


def logs_status(job: TrainingJob) -> dict:
    """Where the job's logs are: kept permanently (exporting, exported to export_path, or
    export_failed with error), or kept until delete_at and then deleted."""
    ended = job.phase in ENDED_PHASES
    if keeps_logs(job):
        status = {"keep_permanently": True, "export_path": export_url(job) if job.log_export_path else None}
        if job.logs_export_error:
            return status | {"state": "export_failed", "error": job.logs_export_error}
        if job.logs_exported_at:
            return status | {"state": "exported", "exported_at": job.logs_exported_at.isoformat()}
        return status | {"state": "exporting" if ended else "kept"}
    status = {"keep_permanently": False, "retention": duration_text(log_retention_s())}
    if job.logs_deleted_at:
        return status | {
            "state": "deleted",
            "deleted_at": job.logs_deleted_at.isoformat(),
            "message": deleted_message(job),
        }
    delete_at = job.ended_at + timedelta(seconds=log_retention_s()) if ended and job.ended_at else None
    return status | {"state": "kept", "delete_at": delete_at.isoformat() if delete_at else None}


def page_context(job: TrainingJob) -> dict:
    """What the Overview and Logs tabs show about the job's outputs."""
    publish, logs = publish_status(job), logs_status(job)
    if logs.get("delete_at"):
        logs["delete_at_text"] = _when(datetime.fromisoformat(logs["delete_at"]))
    ended = job.phase in ENDED_PHASES
    return {
        "publish_status": publish,
        "logs_status": logs,
        "job_ended": ended,
        # Nothing more will change: the page stops asking.
        "outputs_settled": ended and (publish or {}).get("state") != "publishing" and logs["state"] != "exporting",
        "time_zone": timezone.get_current_timezone_name(),
    }
