"""What a job leaves behind once it ended (SPEC §3 "storage" and "more settings").

- Auto-publish: a job that completed publishes its artifacts as a model version, once: V1 of
  a new model, or the next version of the model the user chose.
- Keep logs permanently: the log of every instance (all attempts, in order) is exported to
  `<log path>/<job name>-<job id>/worker-<index>.log` in object storage.
- Otherwise the logs persisted by the console are deleted `log_retention_s()` after the end
  (30 days by default).
- Log downloads, of the whole log or of a time range where the job allows it: logreading.py.

Every step takes a job id, re-reads the database and is safe to run twice or concurrently:
stop.finish() queues `jobs.tasks.job_outputs` after commit, and reconcile steps find the
jobs whose step was lost (complete_job_outputs) or whose logs are due (delete_expired_logs).
"""

from __future__ import annotations

import logging
import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs import events, storage
from jobs.models import FINAL_PHASES, RETAINED_PHASES, EventKind, Phase, TaskRun, TrainingJob

from . import hostpaths, logreading
from .lifecycle import announce

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
    # Whole words per count, each a template of jobs/stored_texts.py (a page shows them translated).
    units = ((86400, "1 day", "{} days"), (3600, "1 hour", "{} hours"), (60, "1 minute", "{} minutes"))
    for size, one, many in (*units, (1, "1 second", "{} seconds")):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return one if count == 1 else many.format(count)
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
    # Asked again at publish time: the artifacts of a bucket taken from the workspace are not read.
    if refused := storage.tenancy_error(job.artifact_path, job.workspace_id, "Artifact storage path"):
        return refused
    try:
        usage = storage.measure(job.artifact_path, stop_after_files=1)
    except storage.StorageError as exc:
        return f"the artifact folder cannot be read: {exc}"
    if usage.files == 0 and not usage.complete:  # folders, and folders in them, and no file yet
        return f"the artifact folder {job.artifact_path} holds no file in its first {usage.folders - 1} folders."
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
    # Asked again at export time: a grant revoked since submission keeps the logs in the console.
    if refused := storage.tenancy_error(url, job.workspace_id, "Log path"):
        raise storage.StorageError(refused.removeprefix("Log path: "))
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
            hostpaths.write_file(
                folder,
                f"worker-{index}.log",
                logreading.instance_log(job, index),
                mode=0o644,
                owner=storage.console_owner(),
            )
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


def when_text(moment: datetime | None) -> str:
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
            "message": logreading.deleted_message(job),
        }
    delete_at = job.ended_at + timedelta(seconds=log_retention_s()) if ended and job.ended_at else None
    return status | {"state": "kept", "delete_at": delete_at.isoformat() if delete_at else None}


def page_context(job: TrainingJob) -> dict:
    """What the Overview and Logs tabs show about the job's outputs."""
    publish, logs = publish_status(job), logs_status(job)
    if logs.get("delete_at"):
        logs["delete_at_text"] = when_text(datetime.fromisoformat(logs["delete_at"]))
    ended = job.phase in ENDED_PHASES
    return {
        "publish_status": publish,
        "logs_status": logs,
        "job_ended": ended,
        # Nothing more will change: the page stops asking.
        "outputs_settled": ended and (publish or {}).get("state") != "publishing" and logs["state"] != "exporting",
        "time_zone": timezone.get_current_timezone_name(),
    }
