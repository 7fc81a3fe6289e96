"""OpenAPI descriptions of the v2 routes (drf-spectacular): raw JSON schemas and examples.

The views are plain APIViews over hand-shaped ModelArts v2 bodies, so the schemas are
written here rather than derived from serializers; keep them in step with
jobs/api/serializers.py (job_representation and the create body).
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse

from jobs.listing import ORDERS, PHASES, SORT_BY

TAG = "training-jobs"

_string_map = {"type": "object", "additionalProperties": {"type": "string"}}

ERROR = {
    "type": "object",
    "description": "ModelArts-shaped error: a code, a message naming the first bad field, and every field's messages.",
    "properties": {
        "error_code": {"type": "string", "example": "Console.400"},
        "error_msg": {"type": "string", "example": "metadata.name: Ensure this value has at most 64 characters."},
        "errors": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    },
    "required": ["error_code", "error_msg"],
}

ANNOTATIONS = {
    **_string_map,
    "description": "High availability (seed 000): fault-tolerance/job-retry-num (1-128; absent or 0 = off), "
    'fault-tolerance/job-unconditional-retry and fault-tolerance/hang-retry ("true"/"false"), '
    "fault-tolerance/pod-retry-num (0-128).",
    "example": {"fault-tolerance/job-retry-num": "3", "fault-tolerance/hang-retry": "true"},
}

NOTIFICATION = {
    "type": "object",
    "properties": {
        "webhook_url": {"type": "string", "format": "uri"},
        "emails": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string", "format": "email"}}]},
        "events": {"type": "array", "items": {"type": "string"}},
    },
}

JOB = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "example": "job"},
        "metadata": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "name": {"type": "string"},
                "description": {"type": "string"},
                "project_id": {"type": "string"},
                "workspace": {"type": "string"},
                "user_name": {"type": "string"},
                "create_time": {"type": "integer", "description": "Milliseconds since the epoch."},
                "annotations": ANNOTATIONS,
            },
        },
        "algorithm": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "engine": {"type": "object", "properties": {"image_url": {"type": "string"}}},
            },
        },
        "spec": {
            "type": "object",
            "properties": {
                "resource": {
                    "type": "object",
                    "properties": {
                        "node_count": {"type": "integer"},
                        "flavor_id": {"type": "string", "nullable": True},
                    },
                },
                "hang_detection": {
                    "type": "object",
                    "properties": {"window_seconds": {"type": "integer", "nullable": True}},
                },
                "notification": NOTIFICATION,
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "phase": {"type": "string", "enum": list(PHASES.values())},
                "reason": {"type": "string"},
                "start_time": {"type": "integer", "nullable": True, "description": "Milliseconds since the epoch."},
                "duration": {"type": "integer", "description": "Milliseconds running (0 before the start)."},
                "restarts_used": {"type": "integer"},
                "max_restarts": {"type": "integer", "description": "R; 0 when fault tolerance is off."},
                "hang_restarts_used": {"type": "integer"},
                "reschedules_used": {"type": "integer"},
                "publish": {
                    "type": "object",
                    "nullable": True,
                    "description": "Auto-publish: null when off.",
                    "properties": {
                        "state": {"type": "string", "enum": ["pending", "publishing", "published", "not_published"]},
                        "model": {"type": "string"},
                        "version": {"type": "string", "example": "V2"},
                        "published_at": {"type": "string", "format": "date-time", "nullable": True},
                        "reason": {"type": "string"},
                    },
                },
                "logs": {
                    "type": "object",
                    "description": "Where the logs are: kept permanently (exported to the log path) or deleted "
                    "after the retention.",
                    "properties": {
                        "keep_permanently": {"type": "boolean"},
                        "state": {
                            "type": "string",
                            "enum": ["kept", "exporting", "exported", "export_failed", "deleted"],
                        },
                        "export_path": {"type": "string", "nullable": True},
                        "exported_at": {"type": "string", "format": "date-time"},
                        "delete_at": {"type": "string", "format": "date-time", "nullable": True},
                        "deleted_at": {"type": "string", "format": "date-time"},
                        "retention": {"type": "string"},
                        "error": {"type": "string"},
                        "message": {"type": "string"},
                    },
                },
            },
        },
    },
}

METRICS = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "task": {"type": "string", "example": "worker-0"},
                    "ok": {"type": "boolean"},
                    "error": {"type": "string", "nullable": True},
                    "took_ms": {"type": "integer"},
                    "truncated": {"type": "boolean"},
                    "samples": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "value": {"type": "number"},
                                "type": {"type": "string", "nullable": True},
                            },
                        },
                    },
                },
            },
        }
    },
}

JOB_LIST = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "description": "Jobs matching the filters (all pages)."},
        "limit": {"type": "integer"},
        "offset": {"type": "integer"},
        "sort_by": {"type": "string", "enum": list(SORT_BY)},
        "order": {"type": "string", "enum": list(ORDERS)},
        "items": {"type": "array", "items": JOB},
    },
}

CREATE_BODY = {
    "type": "object",
    "description": "The ModelArts v2 create body (SPEC §7). A bad field is refused with 400 naming its path.",
    "properties": {
        "kind": {"type": "string", "example": "job"},
        "metadata": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 64, "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string", "maxLength": 256},
                "annotations": ANNOTATIONS,
            },
            "required": ["name"],
        },
        "algorithm": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "engine": {"type": "object", "properties": {"image_url": {"type": "string"}}},
                "code_dir": {"type": "string", "nullable": True},
                "local_code_dir": {"type": "string", "nullable": True},
                "environments": _string_map,
                "inputs": {"type": "array", "items": {"type": "object"}},
                "outputs": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["command"],
        },
        "spec": {
            "type": "object",
            "properties": {
                "resource": {
                    "type": "object",
                    "properties": {
                        "flavor_id": {"type": "string", "nullable": True},
                        "node_count": {"type": "integer", "minimum": 1, "default": 1},
                        "pool_id": {"type": "string", "nullable": True},
                    },
                },
                "volumes": {"type": "array", "items": {"type": "object"}},
                "log_export_path": {"type": "object", "nullable": True},
                "schedule_policy": {
                    "type": "object",
                    "properties": {
                        "priority": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 3,
                            "default": 1,
                            "description": '3 needs the permission "may use high priority".',
                        },
                        "preemptible": {"type": "boolean"},
                    },
                },
                "hang_detection": {"type": "object", "properties": {"window_seconds": {"type": "integer"}}},
                "notification": NOTIFICATION,
            },
        },
    },
    "required": ["metadata", "algorithm"],
}

ACTION_BODY = {
    "type": "object",
    "properties": {"action_type": {"type": "string", "enum": ["terminate"]}},
    "required": ["action_type"],
}

EVENT = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "at": {"type": "string", "format": "date-time"},
        "kind": {"type": "string"},
        "message": {"type": "string"},
        "data": {"type": "object"},
    },
}

RECOVERY = {
    "type": "object",
    "description": "One fault recovery: what was detected, its class and evidence, the decision and the "
    "counters after it.",
    "properties": {
        "id": {"type": "integer"},
        "detected_at": {"type": "string", "format": "date-time"},
        "failure_class": {"type": "string"},
        "rule": {"type": "string"},
        "explanation": {"type": "string"},
        "task": {"type": "string", "nullable": True, "example": "worker-0"},
        "exit_code": {"type": "integer", "nullable": True},
        "oom_killed": {"type": "boolean"},
        "matched_lines": {"type": "array", "items": {"type": "string"}},
        "evidence": {"type": "object"},
        "restart": {"type": "boolean"},
        "level": {"type": "string"},
        "decision": {"type": "string"},
        "restarts_used_after": {"type": "integer"},
        "max_restarts": {"type": "integer"},
        "hang_restarts_after": {"type": "integer"},
        "reschedules_after": {"type": "integer"},
        "failed_attempt": {"type": "integer"},
        "next_attempt": {"type": "integer", "nullable": True},
        "running_again_at": {"type": "string", "format": "date-time", "nullable": True},
        "downtime_s": {"type": "number", "nullable": True},
    },
}


def listing(item: dict) -> dict:
    return {"type": "object", "properties": {"count": {"type": "integer"}, "items": {"type": "array", "items": item}}}


NOT_FOUND = OpenApiResponse(ERROR, description="No such project or job, or the caller may not see it.")
BAD_REQUEST = OpenApiResponse(ERROR, description="A bad field or parameter, named in error_msg and errors.")

LIST_PARAMETERS = [
    OpenApiParameter(
        "phase",
        OpenApiTypes.STR,
        description="Only jobs in these phases: repeat the parameter or separate with commas (case-insensitive). "
        f"One of {', '.join(PHASES.values())}.",
    ),
    OpenApiParameter("name", OpenApiTypes.STR, description="Part of the job name (case-insensitive)."),
    OpenApiParameter("sort_by", OpenApiTypes.STR, enum=list(SORT_BY), description="Default create_time."),
    OpenApiParameter("order", OpenApiTypes.STR, enum=list(ORDERS), description="Default desc."),
    OpenApiParameter("limit", OpenApiTypes.INT, description="Page size (default 50)."),
    OpenApiParameter("offset", OpenApiTypes.INT, description="Jobs to skip."),
]

_EXAMPLE_JOB = {
    "kind": "job",
    "metadata": {
        "id": "3f1c2a9e-6a53-4c4e-9b1e-0d7f3f1a2b3c",
        "name": "resnet-ft",
        "description": "fine-tune",
        "project_id": "0f5e8c1d2b3a4e5f6a7b8c9d0e1f2a3b",
        "workspace": "team",
        "user_name": "alice",
        "create_time": 1767225600000,
        "annotations": {
            "fault-tolerance/job-retry-num": "3",
            "fault-tolerance/job-unconditional-retry": "false",
            "fault-tolerance/hang-retry": "true",
            "fault-tolerance/pod-retry-num": "0",
        },
    },
    "algorithm": {"command": "python train.py", "engine": {"image_url": "pytorch-2.x-cpu"}},
    "spec": {
        "resource": {"node_count": 1, "flavor_id": None},
        "hang_detection": {"window_seconds": None},
        "notification": {"webhook_url": "", "emails": [], "events": []},
    },
    "status": {
        "phase": "Running",
        "reason": "",
        "start_time": 1767225603000,
        "duration": 42000,
        "restarts_used": 1,
        "max_restarts": 3,
        "hang_restarts_used": 0,
        "reschedules_used": 0,
    },
}

JOB_EXAMPLE = OpenApiExample("A running job", value=_EXAMPLE_JOB, response_only=True)
LIST_EXAMPLE = OpenApiExample(
    "Running jobs, newest first",
    value={"count": 1, "limit": 50, "offset": 0, "sort_by": "create_time", "order": "desc", "items": [_EXAMPLE_JOB]},
    response_only=True,
)
CREATE_EXAMPLE = OpenApiExample(
    "Fault-tolerant job",
    value={
        "kind": "job",
        "metadata": {
            "name": "resnet-ft",
            "description": "fine-tune",
            "annotations": {"fault-tolerance/job-retry-num": "3", "fault-tolerance/hang-retry": "true"},
        },
        "algorithm": {"command": "python train.py", "engine": {"image_url": "pytorch-2.x-cpu"}},
        "spec": {"resource": {"node_count": 1}, "schedule_policy": {"priority": 1, "preemptible": False}},
    },
    request_only=True,
)
QUOTA_EXAMPLE = OpenApiExample(
    "Quota reached",
    value={
        "error_code": "Console.400",
        "error_msg": "quota: Job quota reached: an account may have at most 10,000 training jobs. "
        "Delete finished jobs to create new ones.",
        "errors": {"quota": ["Job quota reached: an account may have at most 10,000 training jobs. ..."]},
    },
    response_only=True,
    status_codes=["400"],
)
TERMINATE_EXAMPLE = OpenApiExample("Terminate", value={"action_type": "terminate"}, request_only=True)
