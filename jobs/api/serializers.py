"""The ModelArts v2 body (SPEC §7) <-> TrainingJob.

Parsing only reshapes the body; every rule is the model's clean(), so the API
and the form refuse the same values with the same messages. Errors are keyed
by the path of the field in the body (e.g. "metadata.name").
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from jobs.models import TrainingJob

RETRY_NUM = "fault-tolerance/job-retry-num"
UNCONDITIONAL = "fault-tolerance/job-unconditional-retry"
HANG_RETRY = "fault-tolerance/hang-retry"
POD_RETRY_NUM = "fault-tolerance/pod-retry-num"

# Model field -> where it lives in the API body.
FIELD_PATHS = {
    "name": "metadata.name",
    "description": "metadata.description",
    "command": "algorithm.command",
    "image": "algorithm.engine.image_url",
    "node_count": "spec.resource.node_count",
    "fault_tolerance": f"metadata.annotations.{RETRY_NUM}",
    "max_restarts": f"metadata.annotations.{RETRY_NUM}",
    "unconditional_restart": f"metadata.annotations.{UNCONDITIONAL}",
    "hang_restart": f"metadata.annotations.{HANG_RETRY}",
    "pod_retry_num": f"metadata.annotations.{POD_RETRY_NUM}",
    "hang_window_s": "spec.hang_detection.window_seconds",
    "notify_webhook_url": "spec.notification.webhook_url",
    "notify_emails": "spec.notification.emails",
    "notify_events": "spec.notification.events",
}


def _get(body: dict, path: str) -> Any:
    node: Any = body
    for key in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _bool_annotation(annotations: dict, key: str, errors: dict) -> bool:
    value = annotations.get(key, "false")
    if str(value).lower() not in ("true", "false"):
        errors[f"metadata.annotations.{key}"] = ['Must be "true" or "false".']
        return False
    return str(value).lower() == "true"


def _int(value: Any, path: str, errors: dict, default: int | None = None, rule: str = "") -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(str(value))
    except ValueError:
        errors[path] = [f"Must be an integer{rule}."]
        return default


class TrainingJobCreateSerializer(serializers.Serializer):
    """Validates a create body; .save() returns the TrainingJob (not yet submitted)."""

    def to_internal_value(self, data: Any) -> dict:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": ["Expected a JSON object."]})
        errors: dict[str, list[str]] = {}
        annotations = _get(data, "metadata.annotations") or {}
        if not isinstance(annotations, dict):
            errors["metadata.annotations"] = ["Must be an object of string values."]
            annotations = {}
        retry_num = _int(
            annotations.get(RETRY_NUM),
            f"metadata.annotations.{RETRY_NUM}",
            errors,
            default=0,
            rule=" between 1 and 128 (absent or 0: fault tolerance off)",
        )
        fields = {
            "name": _get(data, "metadata.name") or "",
            "description": _get(data, "metadata.description") or "",
            "command": _get(data, "algorithm.command") or "",
            "image": _get(data, "algorithm.engine.image_url") or "",
            "node_count": _int(
                _get(data, "spec.resource.node_count"), "spec.resource.node_count", errors, 1, " between 1 and 64"
            ),
            # SPEC §7: an absent job-retry-num is 0, and 0 is fault tolerance off.
            "fault_tolerance": bool(retry_num),
            "max_restarts": retry_num if retry_num else 3,
            "unconditional_restart": _bool_annotation(annotations, UNCONDITIONAL, errors),
            "hang_restart": _bool_annotation(annotations, HANG_RETRY, errors),
            "pod_retry_num": _int(
                annotations.get(POD_RETRY_NUM), f"metadata.annotations.{POD_RETRY_NUM}", errors, 0, " between 0 and 128"
            ),
        }
        notification = _get(data, "spec.notification") or {}
        if not isinstance(notification, dict):
            errors["spec.notification"] = ["Must be an object with webhook_url, emails and events."]
            notification = {}
        emails = notification.get("emails") or ""
        if isinstance(emails, list):
            emails = ",".join(str(e) for e in emails)
        events = notification.get("events") or []
        if not isinstance(events, list):
            errors["spec.notification.events"] = ["Must be a list of event names."]
            events = []
        fields |= {
            "notify_webhook_url": notification.get("webhook_url") or "",
            "notify_emails": emails,
            "notify_events": [str(e) for e in events],
            "hang_window_s": _int(
                _get(data, "spec.hang_detection.window_seconds"),
                "spec.hang_detection.window_seconds",
                errors,
                0,
                " of seconds (0: the platform default)",
            ),
        }
        if retry_num is not None and retry_num < 0:
            errors[f"metadata.annotations.{RETRY_NUM}"] = ["Max restarts must be between 1 and 128 (absent or 0: off)."]
        if fields["pod_retry_num"] is not None and fields["pod_retry_num"] < 0:
            errors[f"metadata.annotations.{POD_RETRY_NUM}"] = ["Instance rescheduling count must be between 0 and 128."]
        if errors:
            raise serializers.ValidationError(errors)
        job = TrainingJob(workspace=self.context["workspace"], created_by=self.context["user"], **fields)
        try:
            job.full_clean(exclude=["workspace", "created_by"])
        except DjangoValidationError as exc:
            raise serializers.ValidationError(
                {FIELD_PATHS.get(field, field): messages for field, messages in exc.message_dict.items()}
            ) from None
        return {"job": job}

    def create(self, validated_data: dict) -> TrainingJob:
        job = validated_data["job"]
        job.save()
        return job


def job_representation(job: TrainingJob) -> dict:
    annotations = {}
    if job.fault_tolerance:
        annotations = {
            RETRY_NUM: str(job.max_restarts),
            UNCONDITIONAL: str(job.unconditional_restart).lower(),
            HANG_RETRY: str(job.hang_restart).lower(),
            POD_RETRY_NUM: str(job.pod_retry_num),
        }
    duration = job.duration()
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
            "annotations": annotations,
        },
        "algorithm": {"command": job.command, "engine": {"image_url": job.image}},
        "spec": {
            "resource": {"node_count": job.node_count, "flavor_id": job.flavor.name if job.flavor_id else None},
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
        },
    }


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
