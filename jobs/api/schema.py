"""OpenAPI descriptions of the v2 routes (drf-spectacular): raw JSON schemas and examples.

The views are plain APIViews over hand-shaped ModelArts v2 bodies. The job's fields are
described from the path table (jobs/api/serializers.py API_FIELDS): each at its path, with
the model field's help text and the validators' limits; only what is not a field (ids,
status, errors) is written here.
"""

from __future__ import annotations

import copy

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse

from jobs import validators as v
from jobs.listing import ORDERS, PHASES, SORT_BY

from .fields import API_FIELDS, NAME, NULL_WHEN_OFF, SHAPED, ApiField

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

_TYPES = {NAME: "string"}


def field_schema(spec: ApiField) -> dict:
    """The JSON schema of one field of the path table: its type, the model's help text, limits."""
    model_field = spec.model_field
    schema = copy.deepcopy(spec.schema) if spec.schema else {"type": _TYPES.get(spec.kind, spec.kind)}
    if spec.text:  # annotations are strings: "3", "true"
        schema["type"] = "string"
    elif spec.minimum is not None:
        schema["minimum"] = spec.minimum
        if spec.maximum is not None:
            schema["maximum"] = spec.maximum
    if schema.get("type") == "string" and spec.kind != NAME and getattr(model_field, "max_length", None):
        schema["maxLength"] = model_field.max_length
    default = model_field.default
    if spec.kind not in (NAME, SHAPED) and not spec.text and model_field.has_default() and not callable(default):
        schema["default"] = default
    if model_field.null or spec.empty_is_null:
        schema["nullable"] = True
    if model_field.help_text:
        schema["description"] = str(model_field.help_text)
    return schema


def _place(tree: dict, path: str, schema: dict) -> None:
    """Put `schema` at a dotted body path of an object schema, making the objects on the way;
    a path already described keeps what it has (a path shared by two fields: the first one's)."""
    *parents, last = path.split(".")
    node = tree
    for key in parents:
        if key.isdigit():  # an item of a list (algorithm.outputs.0): described as the list's items
            node = node.setdefault("items", {"type": "object"})
        else:
            node = node.setdefault("properties", {}).setdefault(key, {"type": "object"})
    leaf = node.setdefault("properties", {}).setdefault(last, {})
    for name, value in schema.items():
        leaf.setdefault(name, value)


def fields_schema() -> dict:
    """metadata, algorithm and spec of the body: every field of the path table at its path.
    A path shared by two fields (spec.volumes, publish.model_name) takes the first one's schema."""
    tree: dict = {"type": "object"}
    for spec in API_FIELDS:
        _place(tree, spec.path, field_schema(spec))
    for path in NULL_WHEN_OFF:  # GET: null while off
        _place(tree, path, {"nullable": True})
    return tree["properties"]


FIELDS = fields_schema()
ANNOTATIONS = {
    **FIELDS["metadata"]["properties"]["annotations"],
    **_string_map,
    "description": (
        f"High availability (seed 000); job-retry-num is {v.MAX_RESTARTS_MIN}-{v.MAX_RESTARTS_MAX} when present "
        '("0" is refused); absent: fault tolerance off.'
    ),
    "example": {"fault-tolerance/job-retry-num": "3", "fault-tolerance/hang-retry": "true"},
}
NOTIFICATION = FIELDS["spec"]["properties"]["notification"]

GOODPUT = {
    "type": "object",
    "nullable": True,
    "description": "Goodput, as the Fault recovery tab shows it: null before the first start. Counted from the "
    "first start to the end (or now, while the job runs); each recovery costs its downtime (the failure "
    "detected -> running again) and the work lost since the last checkpoint, where the job reports "
    "checkpoints (GET .../recoveries has each one's cost).",
    "properties": {
        "effective_training_ratio": {
            "type": "number",
            "nullable": True,
            "minimum": 0,
            "maximum": 1,
            "description": "effective_s / elapsed_s, 4 decimal places; null while no time has passed.",
            "example": 0.9731,
        },
        "elapsed_s": {"type": "number", "description": "Seconds since the first start, to the end (or now)."},
        "effective_s": {"type": "number", "description": "elapsed_s less lost_s: time training healthy."},
        "lost_s": {"type": "number", "description": "What the recoveries cost (at most elapsed_s)."},
        "recoveries": {"type": "integer", "description": "Recovery records counted."},
    },
    "required": ["effective_training_ratio", "elapsed_s", "effective_s", "lost_s", "recoveries"],
}

JOB = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "example": "job"},
        "metadata": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                **FIELDS["metadata"]["properties"],
                "project_id": {"type": "string"},
                "workspace": {"type": "string"},
                "user_name": {"type": "string"},
                "create_time": {"type": "integer", "description": "Milliseconds since the epoch."},
                "annotations": ANNOTATIONS,
            },
        },
        "algorithm": FIELDS["algorithm"],
        "spec": FIELDS["spec"],
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
                "goodput": GOODPUT,
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
            **FIELDS["metadata"],
            "properties": {
                **FIELDS["metadata"]["properties"],
                "name": {**FIELDS["metadata"]["properties"]["name"], "pattern": v.JOB_NAME_RE},
                "annotations": ANNOTATIONS,
            },
            "required": ["name"],
        },
        "algorithm": {**FIELDS["algorithm"], "required": ["command"]},
        "spec": FIELDS["spec"],
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
        "downtime_s": {
            "type": "number",
            "nullable": True,
            "description": "Failure detected -> running again; null until it runs again (or when it never does).",
        },
        "work_lost_s": {
            "type": "number",
            "nullable": True,
            "description": "Training time since the last checkpoint, done again; null when the job reports no "
            "checkpoints.",
        },
        "lost_s": {
            "type": "number",
            "nullable": True,
            "description": "What this recovery cost the job's goodput: its downtime (to now or the job's end while "
            "not running again) plus the work lost; null when the job never started.",
        },
    },
}


def listing(item: dict) -> dict:
    return {"type": "object", "properties": {"count": {"type": "integer"}, "items": {"type": "array", "items": item}}}


NOT_FOUND = OpenApiResponse(ERROR, description="No such project or job, or the caller may not see it.")
BAD_REQUEST = OpenApiResponse(ERROR, description="A bad field or parameter, named in error_msg and errors.")
UNAUTHENTICATED = OpenApiResponse(
    ERROR, description="No credentials, or a token that is not valid (WWW-Authenticate: Token)."
)
CSRF_FAILED = OpenApiResponse(
    ERROR, description="Signed in by the browser's session without its CSRF token (scripts use a token)."
)

# What every route answers besides its own responses: 401 without valid credentials; a method that
# changes something also 403, for a session caller without the CSRF token.
AUTH_ERRORS = {401: UNAUTHENTICATED}
UNSAFE_AUTH_ERRORS = {401: UNAUTHENTICATED, 403: CSRF_FAILED}

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
        "goodput": {
            "effective_training_ratio": 0.9731,
            "elapsed_s": 42.0,
            "effective_s": 40.87,
            "lost_s": 1.13,
            "recoveries": 1,
        },
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
