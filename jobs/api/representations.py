"""What GET returns: the same ModelArts v2 shape the create body uses (see serializers.py)."""

from __future__ import annotations

from jobs.models import (
    TrainingJob,
)
from jobs.runtime.outputs import keeps_logs, logs_status, publish_status

from .serializers import (  # noqa: F401
    HANG_RETRY,
    OPERATOR_REEXECUTION,
    POD_RETRY_NUM,
    RETRY_NUM,
    UNCONDITIONAL,
)


def job_representation(job: TrainingJob) -> dict:
    annotations = {}
    if job.fault_tolerance:
        annotations = {
            RETRY_NUM: str(job.max_restarts),
            UNCONDITIONAL: str(job.unconditional_restart).lower(),
            HANG_RETRY: str(job.hang_restart).lower(),
            POD_RETRY_NUM: str(job.pod_retry_num),
        }
    if job.operator_reexecution:
        annotations[OPERATOR_REEXECUTION] = "true"
    duration = job.duration()
    if job.image_source == TrainingJob.ImageSource.PRESET and job.preset_image_id:
        engine = {"engine_name": job.preset_image.name, "image_url": job.image, "image_kind": job.image_kind or None}
    else:
        engine = {"image_url": job.image, "image_kind": job.image_kind or None}
    dedicated = job.dedicated
    resource = {
        "pool_type": job.pool_type,
        "pool_id": job.pool.name if job.pool_id else None,
        "flavor_id": job.flavor.name if job.flavor_id else None,
        "node_count": job.node_count,
    }
    if dedicated and job.spec_type == TrainingJob.SpecType.CUSTOM:
        resource["custom_spec"] = {"cpu": job.custom_cpus, "memory_gb": job.custom_memory_gb, "gpu": job.custom_gpus}
    if dedicated and job.affinity:
        resource["affinity"] = {"type": job.affinity, "strength": job.affinity_strength, "hosts": job.affinity_hosts}
    volumes = []
    if dedicated:
        volumes += [
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
        volumes += [
            {"obs": {"obs_url": m.get("obs_url"), "local_path": m.get("mount_path")}} for m in job.obs_mounts or []
        ]
    outputs = []
    if job.store_artifacts:
        outputs = [
            {
                "name": "artifacts",
                "remote": {"obs": {"obs_url": job.artifact_path}},
                "local_dir": job.artifact_mount_path,
            }
        ]
    publish = None
    if job.auto_publish:
        publish = {
            "as": job.publish_as,
            "model_name": job.publish_model.name
            if job.publish_as == "version" and job.publish_model_id
            else job.model_name,
            "model_type": job.model_type or None,
            "model_brand": job.model_brand,
            "model_description": job.model_description,
            "version_description": job.version_description,
            # The version it will create; once published, the one it created (status.publish).
            "version": job.published_version.label if job.published_version_id else _publish_version(job),
        }
    prometheus = None
    if job.metrics_mode == TrainingJob.MetricsMode.HTTP:
        prometheus = {"type": "http", "path": job.metrics_path, "port": job.metrics_port}
    elif job.metrics_mode == TrainingJob.MetricsMode.COMMAND:
        prometheus = {"type": "command", "command": job.metrics_command, "args": job.metrics_args}
    return {
        "kind": "job",
        "metadata": {
            "id": str(job.id),
            "name": job.name,
            "description": job.description,
            "project_id": job.workspace.project_id,
            "workspace": job.workspace.name,
            "user_name": job.created_by.username,
            "create_time": int(job.created_at.timestamp() * 1000),
            "visibility": job.visibility,
            "tags": job.tags,
            "annotations": annotations,
        },
        "algorithm": {
            "training_mode": job.training_mode,
            "base_model": job.base_model.name if job.base_model_id else None,
            "template": job.preset_template.name if job.preset_template_id else None,
            "command": job.command,
            "engine": engine,
            "code_dir": job.code_dir or None,
            "code_backup_dir": job.code_backup_dir or None,
            "local_code_dir": job.local_code_dir,
            "environments": job.environments_masked(),
            "inputs": [{"name": f"data_{i}", "remote": {"dataset": {"id": d}}} for i, d in enumerate(job.datasets)],
            "outputs": outputs,
        },
        "spec": {
            "resource": resource,
            "volumes": volumes,
            "schedule_policy": {"priority": job.priority, "preemptible": job.preemptible},
            "keep_logs": keeps_logs(job),
            "log_export_path": {"obs_url": job.log_export_path} if job.log_export_path else None,
            "log_time_range_download": job.log_time_range_download,
            "auto_stop_hours": job.auto_stop_hours,
            "retention_hours": job.retention_hours if dedicated else None,
            "publish": publish,
            "access": {
                "jupyter_lab": job.jupyter_lab,
                "ssh": job.ssh_remote,
                "key_pair": job.ssh_key_pair.name if job.ssh_remote and job.ssh_key_pair_id else None,
                "mutual_trust": job.mutual_trust,
                "mutual_trust_dir": job.mutual_trust_dir,
            },
            "observe": {
                "tensorboard": job.tensorboard,
                "mindstudio_insight": job.mindstudio_insight,
                "file_system": job.observe_file_system.name if job.observe_file_system_id else None,
                "path": job.observe_path,
                "prometheus": prometheus,
            },
            "hang_detection": {"window_seconds": job.hang_window_s or None},
            "notification": {
                "webhook_url": job.notify_webhook_url,
                "emails": job.notify_email_list,
                "events": job.notify_events,
            },
        },
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


def recovery_representation(record) -> dict:
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
