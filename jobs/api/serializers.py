"""The ModelArts v2 body (SPEC §7) <-> TrainingJob.

Parsing only reshapes the body; every rule is the model's clean() and field validators,
so the API and the form refuse the same values with the same messages. Errors are keyed
by the path of the field in the body (FIELD_PATHS, e.g. "metadata.name"); a value of the
wrong JSON type is refused here, at its path, before the model sees it. Objects are named
as in the form: flavors, pools, preset images, templates and file systems by their name;
key pairs and models by the name among the caller's own; datasets by id.

The body (POST) and the job (GET) have the same shape; GET adds metadata.id and friends,
status, and the values the platform fills in (the image of a preset engine, publish.version):

    {
      "kind": "job",
      "metadata": {
        "name": "job-1",                       # 1-64 of A-Z a-z 0-9 - _ (required)
        "description": "...",                  # 0-256, letters, CJK, digits, space - _ , . ， 。
        "visibility": "workspace" | "creator",
        "tags": [{"key": "team", "value": "nlp"}],                         # <= 20, unique keys
        "annotations": {
          "fault-tolerance/job-retry-num": "3",                            # 1-128; absent: off
          "fault-tolerance/job-unconditional-retry": "true",
          "fault-tolerance/hang-retry": "true",
          "fault-tolerance/pod-retry-num": "2",                            # 0-128
          "fault-tolerance/operator-reexecution": "true"                   # operator re-execution
        }
      },
      "algorithm": {
        "training_mode": "custom" | "finetune",
        "base_model": "my-model",              # fine-tuning: one of your model assets
        "template": "qwen-sft",                # a preset template: fills what the body leaves empty
        "command": "python ${MA_JOB_DIR}/code/train.py",
        "engine": {"engine_name": "pytorch-2.x-gpu"}                       # a preset image, or
                | {"image_url": "team/trainer:1", "image_kind": "gpu"},    # a custom image (kind optional)
        "code_dir": "obs://bucket/code/",      # required with a preset engine
        "code_backup_dir": "obs://bucket/backup/",
        "local_code_dir": "/home/ma-user/modelarts/user-job-dir",
        "environments": [{"name": "A", "value": "1", "sensitive": false}]  # <= 100; or {"A": "1"}
                                               # GET: sensitive values are "******"
        "inputs": [{"name": "data", "remote": {"dataset": {"id": 7}}}],    # <= 3 datasets
        "outputs": [{"name": "artifacts", "remote": {"obs": {"obs_url": "obs://bucket/out/"}},
                     "local_dir": "/home/ma-user/outputs"}]                # present: store artifacts
      },
      "spec": {
        "resource": {
          "pool_type": "public" | "dedicated", # default: dedicated when pool_id is given
          "pool_id": "pool-a",                 # a dedicated pool's name
          "flavor_id": "gpu.1",                # a flavor's name, or instead (dedicated only)
          "custom_spec": {"cpu": 4, "memory_gb": 16, "gpu": 1},
          "node_count": 1,
          "affinity": {"type": "affinity" | "anti_affinity", "strength": "required" | "preferred",
                       "hosts": ["host-1"]}
        },
        "volumes": [                           # dedicated only
          {"file_system": {"name": "fs1", "path": "/", "local_path": "/mnt/fs1", "read_only": false,
                           "mount_options": "vers=3,timeo=600,nolock,hard"}},          # <= 15
          {"obs": {"obs_url": "obs://bucket/data/", "local_path": "/mnt/obs"}}         # <= 1
        ],
        "schedule_policy": {"priority": 1, "preemptible": false},                      # dedicated only
        "keep_logs": true,                     # absent: on for NPU flavors or when a log path is given
        "log_export_path": {"obs_url": "obs://bucket/logs/"},                          # or a plain string
        "log_time_range_download": false,
        "auto_stop_hours": 4,                  # 1-720; null: off
        "retention_hours": 2,                  # dedicated only, 1-720; null: off
        "publish": {"as": "new" | "version", "model_name": "my-model", "model_type": "text_generation",
                    "model_brand": "Qwen", "model_description": "...", "version_description": "...",
                    "version": "V1"},          # present: auto-publish; version is read-only
        "access": {"jupyter_lab": false, "ssh": false, "key_pair": "laptop",
                   "mutual_trust": false, "mutual_trust_dir": "/home/ma-user/.ssh"},
        "observe": {"tensorboard": false, "mindstudio_insight": false, "file_system": "fs1",
                    "path": "/home/ma-user/summary",
                    "prometheus": {"type": "http", "path": "/metrics", "port": 9100}
                                | {"type": "command", "command": "cat", "args": "/tmp/a.prom"}},
        "hang_detection": {"window_seconds": 600},
        "notification": {"webhook_url": "...", "emails": ["..."], "events": ["failed"]}
      }
    }
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.translation import gettext
from rest_framework import serializers

from jobs import validators as v
from jobs.models import TrainingJob

from .fields import (  # noqa: F401 - API_FIELD, FIELD_PATHS: imported from here by callers
    ACCESS,
    AFFINITY,
    ANNOTATIONS,
    API_FIELD,
    API_FIELDS,
    ARRAY,
    BOOLEAN,
    CUSTOM_SPEC,
    ENGINE,
    FIELD_PATHS,
    INTEGER,
    NAME,
    NOTIFICATION,
    NUMBER,
    OBSERVE,
    OUTPUT,
    PROMETHEUS,
    PUBLISH,
    SHAPED,
    STRING,
    ApiField,
)

_ABSENT = object()


def _get(body: dict, path: str, default: Any = None) -> Any:
    node: Any = body
    for key in path.split("."):
        if isinstance(node, list) and key.isdigit():
            node = node[int(key)] if int(key) < len(node) else None
            continue
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


class _Body:
    """Typed reads of the body; a value of the wrong JSON type is an error at its path.
    Absent and null values read as None: the model's default applies."""

    def __init__(self, data: dict):
        self.data = data
        self.errors: dict[str, list[str]] = {}

    def error(self, path: str, message: str) -> None:
        self.errors.setdefault(path, []).append(message)

    def obj(self, path: str) -> dict:
        value = _get(self.data, path)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, gettext("Must be an object."))
            return {}
        return value

    def list(self, path: str) -> list | None:
        value = _get(self.data, path)
        if value is None or isinstance(value, list):
            return value
        self.error(path, gettext("Must be a list."))
        return None

    def str(self, path: str) -> str | None:
        value = _get(self.data, path)
        if value is None or isinstance(value, str):
            return value
        self.error(path, gettext("Must be a string."))
        return None

    def bool(self, path: str) -> bool | None:
        value = _get(self.data, path)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.error(path, gettext('Must be true or false (or "true" / "false").'))
        return None

    def int(self, path: str, rule: str = "", value: Any = _ABSENT) -> int | None:
        value = _get(self.data, path) if value is _ABSENT else value
        if value is None or value == "":
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        self.error(path, gettext("Must be an integer%(rule)s.") % {"rule": rule})
        return None

    def number(self, path: str) -> float | None:
        value = _get(self.data, path)
        if value is None or value == "":
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return float(str(value))
        except ValueError:
            self.error(path, gettext("Must be a number."))
            return None

    def named(self, field: str, path: str, user):
        """The object of TrainingJob.<field> with the name at `path` (among the user's own where
        only those count, jobs/validators.py NAMED_OBJECTS)."""
        name = self.str(path)
        if not name:
            return None
        queryset = TrainingJob._meta.get_field(field).related_model.objects
        if v.NAMED_OBJECTS[field][1] == "owner":
            queryset = queryset.filter(owner=user)
        found = queryset.filter(name=name).first()
        if found is None:
            self.error(path, v.named_object_missing(field) % {"value": name})
        return found

    def read(self, spec: ApiField, user) -> Any:
        """The value of a (not SHAPED) field at its path, None when absent or of the wrong type."""
        if spec.kind == NAME:
            return self.named(spec.field, spec.path, user)
        if spec.kind == INTEGER:
            return self.int(spec.path, spec.rule)
        readers = {STRING: self.str, BOOLEAN: self.bool, NUMBER: self.number, ARRAY: self.list}
        return readers[spec.kind](spec.path)


def _environments(body: _Body) -> list | None:
    path = "algorithm.environments"
    value = _get(body.data, path)
    if value is None:
        return None
    if isinstance(value, dict):  # ModelArts' map shape: {"NAME": "value"}
        return [{"name": k, "value": v if isinstance(v, str) else str(v), "sensitive": False} for k, v in value.items()]
    if isinstance(value, list):
        return [_env_value_as_text(env) for env in value]
    body.error(path, gettext('Must be a list of {"name", "value", "sensitive"} (or an object of names to values).'))
    return None


def _env_value_as_text(env):
    """A number given as a value is taken as its text (the model wants strings)."""
    if isinstance(env, dict) and isinstance(env.get("value"), (int, float)) and not isinstance(env["value"], bool):
        return {**env, "value": str(env["value"])}
    return env


def _datasets(body: _Body) -> list | None:
    inputs = body.list("algorithm.inputs")
    if inputs is None:
        return None
    ids = []
    for number, item in enumerate(inputs, start=1):
        dataset_id = _get(item, "remote.dataset.id") if isinstance(item, dict) else None
        if dataset_id is None:
            message = gettext('Input %(number)s must be {"remote": {"dataset": {"id": <dataset id>}}}.')
            body.error("algorithm.inputs", message % {"number": number})
            continue
        value = body.int("algorithm.inputs", gettext(" (a dataset id)"), value=dataset_id)
        if value is not None:
            ids.append(value)
    return ids


def _volumes(body: _Body) -> tuple[list | None, list | None]:
    volumes = body.list("spec.volumes")
    if volumes is None:
        return None, None
    fs_mounts, obs_mounts = [], []
    for number, item in enumerate(volumes, start=1):
        if isinstance(item, dict) and isinstance(item.get("file_system"), dict) and len(item) == 1:
            fs = item["file_system"]
            fs_mounts.append(
                {
                    "file_system": fs.get("name"),
                    "path": fs.get("path") or "/",
                    "mount_path": fs.get("local_path"),
                    "read_only": fs.get("read_only", False),
                    "options": fs.get("mount_options") or "",
                }
            )
        elif isinstance(item, dict) and isinstance(item.get("obs"), dict) and len(item) == 1:
            obs_mounts.append({"obs_url": item["obs"].get("obs_url"), "mount_path": item["obs"].get("local_path")})
        else:
            message = gettext('Volume %(number)s must be {"file_system": {...}} or {"obs": {...}}.')
            body.error("spec.volumes", message % {"number": number})
    return fs_mounts, obs_mounts


def _log_export_path(body: _Body) -> str | None:
    path = API_FIELD["log_export_path"].path
    value = _get(body.data, path)
    if isinstance(value, dict):
        return body.str(f"{path}.obs_url")
    if value is not None and not isinstance(value, str):
        body.error(path, gettext('Must be {"obs_url": "obs://bucket/path/"} or a string.'))
        return None
    return value


def _emails(body: _Body) -> str | None:
    """A list of addresses or one comma-separated string; the model checks each."""
    notification = body.obj(NOTIFICATION)
    emails = notification.get("emails") or ""
    if isinstance(emails, list):
        emails = ",".join(str(e) for e in emails)
    return emails if isinstance(emails, str) else None


class TrainingJobCreateSerializer(serializers.Serializer):
    """Validates a create body; .save() returns the TrainingJob (not yet submitted)."""

    def to_internal_value(self, data: Any) -> dict:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": [gettext("Expected a JSON object.")]})
        user = self.context["user"]
        body = _Body(data)
        for path in (ANNOTATIONS, ACCESS, OBSERVE):  # objects of the body: refused when not one
            body.obj(path)
        engine = body.obj(ENGINE)
        outputs = body.list("algorithm.outputs")
        custom_spec = _get(data, CUSTOM_SPEC)
        if custom_spec is not None:
            body.obj(CUSTOM_SPEC)
        publish = bool(body.obj(PUBLISH))
        publish_as = (body.str(f"{PUBLISH}.as") or TrainingJob.PublishAs.NEW) if publish else None
        existing_model = publish_as == TrainingJob.PublishAs.VERSION
        # Which ApiField.within hold: a field inside an object is read only when the object is given.
        present = {
            "custom_image": "engine_name" not in engine,
            OUTPUT: bool(outputs),
            CUSTOM_SPEC: custom_spec is not None,
            AFFINITY: bool(body.obj(AFFINITY)),
            PUBLISH: publish,
            "new_model": publish and not existing_model,
            "existing_model": publish and existing_model,
            PROMETHEUS: bool(body.obj(PROMETHEUS)),
        }
        fields: dict[str, Any] = {
            spec.field: body.read(spec, user)
            for spec in API_FIELDS
            if spec.kind != SHAPED and spec.parsed and (not spec.within or present[spec.within])
        }

        # What the table alone does not say: derived fields, shapes, and defaults of the body.
        # SPEC §7: the annotation is "1".."128" when present; absent, fault tolerance is off. A
        # present "0" is refused with the wizard's 1-128 message (fault tolerance on, max 0).
        retry_present = _get(data, API_FIELD["max_restarts"].path) is not None
        retry_num = body.read(API_FIELD["max_restarts"], user) if retry_present else 0
        pool_id = _get(data, API_FIELD["pool"].path)
        fs_mounts, obs_mounts = _volumes(body)
        fields |= {
            "name": fields["name"] or "",
            "command": fields["command"] or "",
            "fault_tolerance": retry_present,
            "max_restarts": retry_num if retry_present else 3,
            "image_source": TrainingJob.ImageSource.PRESET if "engine_name" in engine else None,
            "environments": _environments(body),
            "datasets": _datasets(body),
            "pool_type": fields["pool_type"] or ("dedicated" if isinstance(pool_id, str) and pool_id else None),
            "file_system_mounts": fs_mounts,
            "obs_mounts": obs_mounts,
            "log_export_path": _log_export_path(body),
            "notify_emails": _emails(body),
            "notify_events": [str(e) for e in fields["notify_events"] or []],
        }
        if outputs:
            if len(outputs) > 1:
                body.error("algorithm.outputs", gettext("At most one output (the training artifacts) is allowed."))
            fields |= {"store_artifacts": True, "artifact_path": fields["artifact_path"] or ""}
        if present[CUSTOM_SPEC]:
            fields["spec_type"] = TrainingJob.SpecType.CUSTOM
        if present[AFFINITY]:
            fields |= {"affinity": fields["affinity"] or "", "affinity_hosts": fields["affinity_hosts"] or []}
        if publish:
            fields |= {"auto_publish": True, "publish_as": publish_as}
        if present[PROMETHEUS]:
            fields["metrics_mode"] = fields["metrics_mode"] or ""
        template = body.read(API_FIELD["preset_template"], user)

        if body.errors:
            raise serializers.ValidationError(body.errors)
        job = TrainingJob(
            workspace=self.context["workspace"],
            created_by=user,
            **{k: value for k, value in fields.items() if value is not None},
        )
        if template is not None:
            template.apply_template(job, overwrite=False)
        try:
            job.full_clean(exclude=["workspace", "created_by"])
        except DjangoValidationError as exc:
            raise serializers.ValidationError(api_errors(exc)) from None
        return {"job": job}

    def create(self, validated_data: dict) -> TrainingJob:
        job = validated_data["job"]
        job.save()
        return job


def api_errors(exc: DjangoValidationError) -> dict[str, list[str]]:
    """A model ValidationError keyed by body paths (messages of fields at one path are merged)."""
    errors: dict[str, list[str]] = {}
    for field, messages in exc.message_dict.items():
        path = FIELD_PATHS.get(field, field)
        errors.setdefault(path, []).extend(m for m in messages if m not in errors.get(path, []))
    return errors
