"""What GET returns: the same ModelArts v2 shape the create body uses (see serializers.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobs.goodput import as_dict, cost_dict, job_goodput
from jobs.models import (
    TrainingJob,
)
from jobs.runtime.outputs import keeps_logs, logs_status, publish_status

from .fields import (  # noqa: F401
    API_FIELDS,
    HANG_RETRY,
    NAME,
    NULL_WHEN_OFF,
    OPERATOR_REEXECUTION,
    OUTPUT,
    POD_RETRY_NUM,
    PROMETHEUS,
    PUBLISH,
    RETRY_NUM,
    SHAPED,
    UNCONDITIONAL,
    ApiField,
)

_OMIT = object()

# When GET shows the fields of an object of the body (ApiField.within); otherwise the object is
# null (fields.NULL_WHEN_OFF) or left out.
_GROUPS: dict[str, Callable[[TrainingJob], bool]] = {
    "spec.resource.custom_spec": lambda job: job.dedicated and job.spec_type == TrainingJob.SpecType.CUSTOM,
    "spec.resource.affinity": lambda job: job.dedicated and bool(job.affinity),
    OUTPUT: lambda job: job.store_artifacts,
    PUBLISH: lambda job: job.auto_publish,
    "new_model": lambda job: job.auto_publish,
    "existing_model": lambda job: job.auto_publish,
    PROMETHEUS: lambda job: job.metrics_mode in (TrainingJob.MetricsMode.HTTP, TrainingJob.MetricsMode.COMMAND),
}

# Values GET shows other than the field's own (what the platform decides, or null when unused).
_VALUES: dict[str, Callable[[TrainingJob], Any]] = {
    "keep_logs": keeps_logs,
    "retention_hours": lambda job: job.retention_hours if job.dedicated else None,
    "ssh_key_pair": lambda job: job.ssh_key_pair.name if job.ssh_remote and job.ssh_key_pair_id else None,
}


def _volumes(job: TrainingJob) -> list:
    if not job.dedicated:
        return []
    file_systems = [
        {
            "file_system": {
                "name": m.get("file_system"),
                "path": m.get("path"),
                "local_path": m.get("mount_path"),
                "read_only": m.get("read_only", False),
                "mount_options": m.get("options", ""),
            }
        }
        for m in job.file_system_mounts or []
    ]
    buckets = [{"obs": {"obs_url": m.get("obs_url"), "local_path": m.get("mount_path")}} for m in job.obs_mounts or []]
    return file_systems + buckets


# The shapes of SHAPED fields (ApiField.kind); _OMIT: shown by another field at the same path.
_SHAPES: dict[str, Callable[[TrainingJob], Any]] = {
    "fault_tolerance": lambda job: _OMIT,  # max_restarts shows job-retry-num while it is on
    "image_source": lambda job: {},  # the engine: filled by preset_image, image and image_kind
    "environments": TrainingJob.environments_masked,
    "datasets": lambda job: [
        {"name": f"data_{i}", "remote": {"dataset": {"id": d}}} for i, d in enumerate(job.datasets)
    ],
    "store_artifacts": lambda job: [{"name": "artifacts"}] if job.store_artifacts else [],
    "spec_type": lambda job: _OMIT,  # custom_spec: filled by custom_cpus, ... when shown
    "file_system_mounts": _volumes,
    "obs_mounts": lambda job: _OMIT,  # in spec.volumes with the file system mounts
    "log_export_path": lambda job: {"obs_url": job.log_export_path} if job.log_export_path else None,
    "auto_publish": lambda job: _OMIT,  # spec.publish: filled by publish_as, ... when shown
    "notify_emails": lambda job: job.notify_email_list,
}


def _value(spec: ApiField, job: TrainingJob) -> Any:
    if spec.kind == SHAPED:
        return _SHAPES[spec.field](job)
    if spec.field in _VALUES:
        return _VALUES[spec.field](job)
    value = getattr(job, spec.field)
    if spec.kind == NAME:
        return value.name if value is not None else None
    if spec.text:
        return str(value).lower()
    return value or None if spec.empty_is_null else value


def _place(body: dict, path: str, value: Any) -> None:
    """Set `value` at a dotted path, making the objects (and list items) on the way."""
    *parents, last = path.split(".")
    node: Any = body
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value


def job_fields(job: TrainingJob) -> dict:
    """Every field of the path table (serializers.API_FIELDS) at its path, as GET shows it."""
    body: dict = {"metadata": {}, "algorithm": {}, "spec": {}}
    for spec in API_FIELDS:
        shown = _GROUPS.get(spec.within)
        if shown is not None and not shown(job):
            if spec.within in NULL_WHEN_OFF:
                _place(body, spec.within, None)
            continue
        if spec.shown is not None and not spec.shown(job):
            continue
        value = _value(spec, job)
        if value is not _OMIT:
            _place(body, spec.path, value)
    body["metadata"].setdefault("annotations", {})  # {} while fault tolerance is off
    return body


def job_representation(job: TrainingJob) -> dict:
    duration = job.duration()
    body = job_fields(job)
    metadata = body["metadata"]
    if job.auto_publish:
        # The version it will create; once published, the one it created (status.publish).
        body["spec"]["publish"]["version"] = (
            job.published_version.label if job.published_version_id else _publish_version(job)
        )
    return {
        "kind": "job",
        # What the platform fills in sits beside the name, as in ModelArts' responses.
        "metadata": {
            "id": str(job.id),
            "name": metadata.pop("name"),
            "description": metadata.pop("description"),
            "project_id": job.workspace.project_id,
            "workspace": job.workspace.name,
            "user_name": job.created_by.username,
            "create_time": int(job.created_at.timestamp() * 1000),
            **metadata,
        },
        "algorithm": body["algorithm"],
        "spec": body["spec"],
        "status": {
            "phase": job.phase,
            "reason": job.phase_reason,
            "start_time": int(job.started_at.timestamp() * 1000) if job.started_at else None,
            "duration": int(duration.total_seconds() * 1000) if duration else 0,
            "restarts_used": job.restarts_used,
            "max_restarts": job.max_restarts_effective,
            "hang_restarts_used": job.hang_restarts_used,
            "reschedules_used": job.reschedules_used,
            # What the job left once it ended (jobs/runtime/outputs.py).
            "publish": publish_status(job),
            "logs": logs_status(job),
            # The Fault recovery tab's figures (jobs/goodput.py): null before the first start.
            "goodput": as_dict(job_goodput(job)),
        },
    }


def _publish_version(job: TrainingJob) -> str:
    """job.publish_version, from the list query's annotation when it has one (jobs.listing.for_api):
    the property asks the model for its latest version, a query per listed job."""
    if not hasattr(job, "publish_model_latest_number"):
        return job.publish_version
    if job.publish_as == TrainingJob.PublishAs.VERSION and job.publish_model_id:
        return f"V{(job.publish_model_latest_number or 0) + 1}"
    return "V1"


def event_representation(event) -> dict:
    data = {k: v for k, v in event.data.items() if k != "job_at_event"}
    return {"id": event.id, "at": event.at.isoformat(), "kind": event.kind, "message": event.message, "data": data}


def recovery_representation(record, cost=None) -> dict:
    """One record; cost: its goodput cost (jobs.goodput.recovery_costs), null figures without."""
    return {
        "id": record.id,
        "detected_at": record.detected_at.isoformat(),
        "failure_class": record.failure_class,
        "rule": record.rule,
        "explanation": record.explanation,
        "task": f"worker-{record.task_index}" if record.task_index is not None else None,
        "exit_code": record.exit_code,
        "oom_killed": record.oom_killed,
        "matched_lines": record.matched_lines,
        "evidence": record.evidence,
        "restart": record.restart,
        "level": record.level,
        "decision": record.decision,
        "restarts_used_after": record.restarts_used_after,
        "max_restarts": record.max_restarts,
        "hang_restarts_after": record.hang_restarts_after,
        "reschedules_after": record.reschedules_after,
        "failed_attempt": record.failed_attempt.number,
        "next_attempt": record.next_attempt.number if record.next_attempt else None,
        "running_again_at": record.running_again_at.isoformat() if record.running_again_at else None,
        "downtime_s": record.downtime.total_seconds() if record.downtime else None,
        **cost_dict(cost),
    }


# What only the platform fills in (GET shows it; a create body leaves it out).
_READ_ONLY_METADATA = ("id", "project_id", "workspace", "user_name", "create_time")


def request_body(job: TrainingJob) -> dict:
    """The SPEC §7 create body for this (possibly unsaved) job: what the wizard's review shows,
    and exactly what POST /v2/{project_id}/training-jobs accepts to create the same job.
    Unlike GET, sensitive env var values are the real ones: the user is about to submit them."""
    body = job_representation(job)
    body.pop("status")
    for key in _READ_ONLY_METADATA:
        body["metadata"].pop(key, None)
    algorithm = body["algorithm"]
    algorithm["environments"] = [dict(env) for env in job.environments or []]
    if job.image_source == TrainingJob.ImageSource.PRESET and job.preset_image_id:
        algorithm["engine"] = {"engine_name": job.preset_image.name}
    if body["spec"].get("publish"):
        body["spec"]["publish"].pop("version", None)
    return _without_empty(body)


def _without_empty(value):
    """Drop None values and empty objects (absent means default in the body), keep [] and false."""
    if isinstance(value, dict):
        cleaned = {k: _without_empty(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in cleaned.items() if v != {}}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value
