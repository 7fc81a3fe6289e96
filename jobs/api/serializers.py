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
          "fault-tolerance/job-retry-num": "3",                            # 1-128; absent or "0": off
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

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from jobs.models import (
    FileSystem,
    Flavor,
    KeyPair,
    Model,
    PresetImage,
    PresetTemplate,
    ResourcePool,
    TrainingJob,
)

RETRY_NUM = "fault-tolerance/job-retry-num"
UNCONDITIONAL = "fault-tolerance/job-unconditional-retry"
HANG_RETRY = "fault-tolerance/hang-retry"
POD_RETRY_NUM = "fault-tolerance/pod-retry-num"
OPERATOR_REEXECUTION = "fault-tolerance/operator-reexecution"

OUTPUT = "algorithm.outputs.0"
PUBLISH = "spec.publish"
PROMETHEUS = "spec.observe.prometheus"

# Model field -> where it lives in the API body.
FIELD_PATHS = {
    "training_mode": "algorithm.training_mode",
    "base_model": "algorithm.base_model",
    "name": "metadata.name",
    "description": "metadata.description",
    "preset_template": "algorithm.template",
    "image_source": "algorithm.engine",
    "preset_image": "algorithm.engine.engine_name",
    "image": "algorithm.engine.image_url",
    "image_kind": "algorithm.engine.image_kind",
    "command": "algorithm.command",
    "code_dir": "algorithm.code_dir",
    "code_backup_dir": "algorithm.code_backup_dir",
    "local_code_dir": "algorithm.local_code_dir",
    "environments": "algorithm.environments",
    "pool_type": "spec.resource.pool_type",
    "pool": "spec.resource.pool_id",
    "spec_type": "spec.resource.custom_spec",
    "flavor": "spec.resource.flavor_id",
    "custom_cpus": "spec.resource.custom_spec.cpu",
    "custom_memory_gb": "spec.resource.custom_spec.memory_gb",
    "custom_gpus": "spec.resource.custom_spec.gpu",
    "node_count": "spec.resource.node_count",
    "affinity": "spec.resource.affinity.type",
    "affinity_strength": "spec.resource.affinity.strength",
    "affinity_hosts": "spec.resource.affinity.hosts",
    "file_system_mounts": "spec.volumes",
    "obs_mounts": "spec.volumes",
    "priority": "spec.schedule_policy.priority",
    "preemptible": "spec.schedule_policy.preemptible",
    "datasets": "algorithm.inputs",
    "store_artifacts": "algorithm.outputs",
    "artifact_path": f"{OUTPUT}.remote.obs.obs_url",
    "artifact_mount_path": f"{OUTPUT}.local_dir",
    "auto_publish": PUBLISH,
    "publish_as": f"{PUBLISH}.as",
    "model_name": f"{PUBLISH}.model_name",
    "model_type": f"{PUBLISH}.model_type",
    "model_brand": f"{PUBLISH}.model_brand",
    "model_description": f"{PUBLISH}.model_description",
    "publish_model": f"{PUBLISH}.model_name",
    "version_description": f"{PUBLISH}.version_description",
    "fault_tolerance": f"metadata.annotations.{RETRY_NUM}",
    "max_restarts": f"metadata.annotations.{RETRY_NUM}",
    "unconditional_restart": f"metadata.annotations.{UNCONDITIONAL}",
    "hang_restart": f"metadata.annotations.{HANG_RETRY}",
    "pod_retry_num": f"metadata.annotations.{POD_RETRY_NUM}",
    "operator_reexecution": f"metadata.annotations.{OPERATOR_REEXECUTION}",
    "hang_window_s": "spec.hang_detection.window_seconds",
    "jupyter_lab": "spec.access.jupyter_lab",
    "ssh_remote": "spec.access.ssh",
    "ssh_key_pair": "spec.access.key_pair",
    "mutual_trust": "spec.access.mutual_trust",
    "mutual_trust_dir": "spec.access.mutual_trust_dir",
    "tensorboard": "spec.observe.tensorboard",
    "mindstudio_insight": "spec.observe.mindstudio_insight",
    "observe_file_system": "spec.observe.file_system",
    "observe_path": "spec.observe.path",
    "metrics_mode": f"{PROMETHEUS}.type",
    "metrics_path": f"{PROMETHEUS}.path",
    "metrics_port": f"{PROMETHEUS}.port",
    "metrics_command": f"{PROMETHEUS}.command",
    "metrics_args": f"{PROMETHEUS}.args",
    "keep_logs": "spec.keep_logs",
    "log_export_path": "spec.log_export_path",
    "log_time_range_download": "spec.log_time_range_download",
    "visibility": "metadata.visibility",
    "auto_stop_hours": "spec.auto_stop_hours",
    "retention_hours": "spec.retention_hours",
    "tags": "metadata.tags",
    "notify_webhook_url": "spec.notification.webhook_url",
    "notify_emails": "spec.notification.emails",
    "notify_events": "spec.notification.events",
    NON_FIELD_ERRORS: "body",
}

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
            self.error(path, "Must be an object.")
            return {}
        return value

    def list(self, path: str) -> list | None:
        value = _get(self.data, path)
        if value is None or isinstance(value, list):
            return value
        self.error(path, "Must be a list.")
        return None

    def str(self, path: str) -> str | None:
        value = _get(self.data, path)
        if value is None or isinstance(value, str):
            return value
        self.error(path, "Must be a string.")
        return None

    def bool(self, path: str) -> bool | None:
        value = _get(self.data, path)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.error(path, 'Must be true or false (or "true" / "false").')
        return None

    def int(self, path: str, rule: str = "", value: Any = _ABSENT) -> int | None:
        value = _get(self.data, path) if value is _ABSENT else value
        if value is None or value == "":
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        self.error(path, f"Must be an integer{rule}.")
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
            self.error(path, "Must be a number.")
            return None

    def named(self, path: str, queryset, message: str):
        name = self.str(path)
        if not name:
            return None
        found = queryset.filter(name=name).first()
        if found is None:
            self.error(path, message.format(value=name))
        return found


def _environments(body: _Body) -> list | None:
    path = "algorithm.environments"
    value = _get(body.data, path)
    if value is None:
        return None
    if isinstance(value, dict):  # ModelArts' map shape: {"NAME": "value"}
        return [{"name": k, "value": v if isinstance(v, str) else str(v), "sensitive": False} for k, v in value.items()]
    if isinstance(value, list):
        return [_env_value_as_text(env) for env in value]
    body.error(path, 'Must be a list of {"name", "value", "sensitive"} (or an object of names to values).')
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
            body.error(
                "algorithm.inputs", f'Input {number} must be {{"remote": {{"dataset": {{"id": <dataset id>}}}}}}.'
            )
            continue
        value = body.int("algorithm.inputs", " (a dataset id)", value=dataset_id)
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
            body.error("spec.volumes", f'Volume {number} must be {{"file_system": {{...}}}} or {{"obs": {{...}}}}.')
    return fs_mounts, obs_mounts


class TrainingJobCreateSerializer(serializers.Serializer):
    """Validates a create body; .save() returns the TrainingJob (not yet submitted)."""

    def to_internal_value(self, data: Any) -> dict:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": ["Expected a JSON object."]})
        user = self.context["user"]
        body = _Body(data)
        fields: dict[str, Any] = {}

        # metadata
        body.obj("metadata.annotations")
        retry_num = body.int(
            f"metadata.annotations.{RETRY_NUM}", " between 1 and 128 (absent or 0: fault tolerance off)"
        )
        retry_num = retry_num or 0
        fields |= {
            "name": body.str("metadata.name") or "",
            "description": body.str("metadata.description"),
            "visibility": body.str("metadata.visibility"),
            "tags": body.list("metadata.tags"),
            # SPEC §7: an absent job-retry-num is 0, and 0 is fault tolerance off.
            "fault_tolerance": retry_num != 0,
            "max_restarts": retry_num if retry_num else 3,
            "unconditional_restart": body.bool(f"metadata.annotations.{UNCONDITIONAL}"),
            "hang_restart": body.bool(f"metadata.annotations.{HANG_RETRY}"),
            "pod_retry_num": body.int(f"metadata.annotations.{POD_RETRY_NUM}", " between 0 and 128"),
            "operator_reexecution": body.bool(f"metadata.annotations.{OPERATOR_REEXECUTION}"),
        }

        # algorithm
        engine = body.obj("algorithm.engine")
        preset_image = body.named(
            "algorithm.engine.engine_name", PresetImage.objects, "Preset image '{value}' does not exist."
        )
        fields |= {
            "training_mode": body.str("algorithm.training_mode"),
            "base_model": body.named(
                "algorithm.base_model", Model.objects.filter(owner=user), "You have no model named '{value}'."
            ),
            "command": body.str("algorithm.command") or "",
            "image_source": TrainingJob.ImageSource.PRESET if "engine_name" in engine else None,
            "preset_image": preset_image,
            "image": body.str("algorithm.engine.image_url") if "engine_name" not in engine else None,
            "image_kind": body.str("algorithm.engine.image_kind") if "engine_name" not in engine else None,
            "code_dir": body.str("algorithm.code_dir"),
            "code_backup_dir": body.str("algorithm.code_backup_dir"),
            "local_code_dir": body.str("algorithm.local_code_dir"),
            "environments": _environments(body),
            "datasets": _datasets(body),
        }
        template = body.named("algorithm.template", PresetTemplate.objects, "Preset template '{value}' does not exist.")
        outputs = body.list("algorithm.outputs")
        if outputs:
            if len(outputs) > 1:
                body.error("algorithm.outputs", "At most one output (the training artifacts) is allowed.")
            fields |= {
                "store_artifacts": True,
                "artifact_path": body.str(f"{OUTPUT}.remote.obs.obs_url") or "",
                "artifact_mount_path": body.str(f"{OUTPUT}.local_dir"),
            }

        # spec.resource
        pool_id = body.str("spec.resource.pool_id")
        custom = _get(data, "spec.resource.custom_spec")
        fields |= {
            "pool_type": body.str("spec.resource.pool_type") or ("dedicated" if pool_id else None),
            "pool": body.named(
                "spec.resource.pool_id", ResourcePool.objects, "Resource pool '{value}' does not exist."
            ),
            "flavor": body.named("spec.resource.flavor_id", Flavor.objects, "Flavor '{value}' does not exist."),
            "node_count": body.int("spec.resource.node_count", " between 1 and 64"),
        }
        if custom is not None:
            body.obj("spec.resource.custom_spec")
            fields |= {
                "spec_type": TrainingJob.SpecType.CUSTOM,
                "custom_cpus": body.number("spec.resource.custom_spec.cpu"),
                "custom_memory_gb": body.number("spec.resource.custom_spec.memory_gb"),
                "custom_gpus": body.int("spec.resource.custom_spec.gpu"),
            }
        if body.obj("spec.resource.affinity"):
            fields |= {
                "affinity": body.str("spec.resource.affinity.type") or "",
                "affinity_strength": body.str("spec.resource.affinity.strength"),
                "affinity_hosts": body.list("spec.resource.affinity.hosts") or [],
            }
        fs_mounts, obs_mounts = _volumes(body)
        fields |= {
            "file_system_mounts": fs_mounts,
            "obs_mounts": obs_mounts,
            "priority": body.int("spec.schedule_policy.priority", " between 1 and 3"),
            "preemptible": body.bool("spec.schedule_policy.preemptible"),
        }

        # spec: logs, auto stop, retention
        log_path = _get(data, "spec.log_export_path")
        if isinstance(log_path, dict):
            log_path = body.str("spec.log_export_path.obs_url")
        elif log_path is not None and not isinstance(log_path, str):
            body.error("spec.log_export_path", 'Must be {"obs_url": "obs://bucket/path/"} or a string.')
            log_path = None
        fields |= {
            "keep_logs": body.bool("spec.keep_logs"),
            "log_export_path": log_path,
            "log_time_range_download": body.bool("spec.log_time_range_download"),
            "auto_stop_hours": body.int("spec.auto_stop_hours", " of hours, 1-720 (null: off)"),
            "retention_hours": body.int("spec.retention_hours", " of hours, 1-720 (null: off)"),
        }

        # spec.publish
        if body.obj(PUBLISH):
            publish_as = body.str(f"{PUBLISH}.as") or TrainingJob.PublishAs.NEW
            fields |= {
                "auto_publish": True,
                "publish_as": publish_as,
                "model_type": body.str(f"{PUBLISH}.model_type"),
                "model_brand": body.str(f"{PUBLISH}.model_brand"),
                "model_description": body.str(f"{PUBLISH}.model_description"),
                "version_description": body.str(f"{PUBLISH}.version_description"),
            }
            if publish_as == TrainingJob.PublishAs.VERSION:
                fields["publish_model"] = body.named(
                    f"{PUBLISH}.model_name", Model.objects.filter(owner=user), "You have no model named '{value}'."
                )
            else:
                fields["model_name"] = body.str(f"{PUBLISH}.model_name")

        # spec.access and spec.observe
        body.obj("spec.access")
        body.obj("spec.observe")
        fields |= {
            "jupyter_lab": body.bool("spec.access.jupyter_lab"),
            "ssh_remote": body.bool("spec.access.ssh"),
            "ssh_key_pair": body.named(
                "spec.access.key_pair", KeyPair.objects.filter(owner=user), "You have no key pair named '{value}'."
            ),
            "mutual_trust": body.bool("spec.access.mutual_trust"),
            "mutual_trust_dir": body.str("spec.access.mutual_trust_dir"),
            "tensorboard": body.bool("spec.observe.tensorboard"),
            "mindstudio_insight": body.bool("spec.observe.mindstudio_insight"),
            "observe_file_system": body.named(
                "spec.observe.file_system", FileSystem.objects, "File system '{value}' does not exist."
            ),
            "observe_path": body.str("spec.observe.path"),
        }
        if body.obj(PROMETHEUS):
            fields |= {
                "metrics_mode": body.str(f"{PROMETHEUS}.type") or "",
                "metrics_path": body.str(f"{PROMETHEUS}.path"),
                "metrics_port": body.int(f"{PROMETHEUS}.port", " between 1 and 65535"),
                "metrics_command": body.str(f"{PROMETHEUS}.command"),
                "metrics_args": body.str(f"{PROMETHEUS}.args"),
            }

        # spec.notification and spec.hang_detection
        notification = body.obj("spec.notification")
        emails = notification.get("emails") or ""
        if isinstance(emails, list):
            emails = ",".join(str(e) for e in emails)
        events = body.list("spec.notification.events") or []
        fields |= {
            "notify_webhook_url": body.str("spec.notification.webhook_url"),
            "notify_emails": emails if isinstance(emails, str) else None,
            "notify_events": [str(e) for e in events],
            "hang_window_s": body.int("spec.hang_detection.window_seconds", " of seconds (0: the platform default)"),
        }

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
