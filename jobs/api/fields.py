"""The API's path table: where each TrainingJob field lives in the v2 body (SPEC §7), its JSON
kind and its limits, said once. serializers.py parses from it, representations.py writes GET
from it, schema.py generates the OpenAPI properties from it; labels and help texts come from
the model (tests/test_field_declarations.py holds all three to it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from django.core.exceptions import NON_FIELD_ERRORS
from django.utils.translation import gettext_lazy as _

from jobs import validators as v
from jobs.i18n import lazy_fill
from jobs.models import TrainingJob

RETRY_NUM = "fault-tolerance/job-retry-num"
UNCONDITIONAL = "fault-tolerance/job-unconditional-retry"
HANG_RETRY = "fault-tolerance/hang-retry"
POD_RETRY_NUM = "fault-tolerance/pod-retry-num"
OPERATOR_REEXECUTION = "fault-tolerance/operator-reexecution"

ANNOTATIONS = "metadata.annotations"
ENGINE = "algorithm.engine"
OUTPUT = "algorithm.outputs.0"
CUSTOM_SPEC = "spec.resource.custom_spec"
AFFINITY = "spec.resource.affinity"
PUBLISH = "spec.publish"
ACCESS = "spec.access"
OBSERVE = "spec.observe"
PROMETHEUS = "spec.observe.prometheus"
NOTIFICATION = "spec.notification"

# Objects of the body GET shows as null while they are off (no auto-publish, no Prometheus
# metrics); the fields within them are left out then. Other objects are left out whole.
NULL_WHEN_OFF = frozenset({PUBLISH, PROMETHEUS})

# JSON kinds of the table: what the body holds at a field's path.
STRING, BOOLEAN, INTEGER, NUMBER, ARRAY = "string", "boolean", "integer", "number", "array"
NAME = "name"  # an object chosen by its name (jobs/validators.py NAMED_OBJECTS), a string
SHAPED = "shaped"  # a shape this module and representations.py build by hand (engine, volumes, ...)


@dataclass(frozen=True)
class ApiField:
    """Where one TrainingJob field lives in the v2 body, and what it takes there.

    The one declaration of the field for the API: the parser reads it from `path`, GET shows it
    there (representations.py) and the OpenAPI schema describes it there (schema.py), with the
    model field's help text and these limits.

    within: the object of the body the field belongs to; it is read only when that object is in
    the body (a custom spec, an affinity, an output, publish, Prometheus metrics). shown: when GET
    shows the field at all (absent otherwise). text: shown as a string (annotations are strings).
    rule: what the type error of an integer adds ("Must be an integer between 1 and 64.").
    schema: the JSON schema of a SHAPED value.
    """

    field: str
    path: str
    kind: str
    within: str = ""
    minimum: int | None = None
    maximum: int | None = None
    rule: str = ""
    parsed: bool = True
    shown: Callable[[TrainingJob], bool] | None = None
    empty_is_null: bool = False
    text: bool = False
    schema: dict = dataclass_field(default_factory=dict)

    @property
    def model_field(self):
        return TrainingJob._meta.get_field(self.field)


# The rules are lazy: an error message says them in the language of its request (Accept-Language).
def _between(low: int, high: int, note="") -> dict:
    return {
        "minimum": low,
        "maximum": high,
        "rule": lazy_fill(_(" between %(low)s and %(high)s%(note)s"), low=low, high=high, note=note),
    }


_HOURS = {
    "minimum": v.HOURS_MIN,
    "maximum": v.HOURS_MAX,
    "rule": lazy_fill(_(" of hours, %(min)s-%(max)s (null: off)"), min=v.HOURS_MIN, max=v.HOURS_MAX),
}
_OBJECTS = {"type": "array", "items": {"type": "object"}}


def _tolerant(job: TrainingJob) -> bool:
    return job.fault_tolerance


def _dedicated(job: TrainingJob) -> bool:
    return job.dedicated


def _existing_model(job: TrainingJob) -> bool:
    return job.publish_as == TrainingJob.PublishAs.VERSION and bool(job.publish_model_id)


def _prometheus(field: str, key: str, kind: str, mode: str, **limits) -> ApiField:
    """A setting of Prometheus metrics: GET shows it only in the mode that uses it (http: path and
    port; command: command and arguments)."""
    return ApiField(
        field, f"{PROMETHEUS}.{key}", kind, within=PROMETHEUS, shown=lambda job: job.metrics_mode == mode, **limits
    )


# In the body's order (GET shows them in it).
API_FIELDS: tuple[ApiField, ...] = (
    ApiField("name", "metadata.name", STRING),
    ApiField("description", "metadata.description", STRING),
    ApiField("visibility", "metadata.visibility", STRING),
    ApiField("tags", "metadata.tags", ARRAY, schema=_OBJECTS),
    ApiField(
        "max_restarts",
        f"{ANNOTATIONS}.{RETRY_NUM}",
        INTEGER,
        parsed=False,
        shown=_tolerant,
        text=True,
        **_between(v.MAX_RESTARTS_MIN, v.MAX_RESTARTS_MAX, _(" (absent: fault tolerance off)")),
    ),
    # SPEC §7: job-retry-num is "1".."128"; absent, fault tolerance is off. Both fields live there.
    ApiField("fault_tolerance", f"{ANNOTATIONS}.{RETRY_NUM}", SHAPED, shown=lambda job: False),
    ApiField("unconditional_restart", f"{ANNOTATIONS}.{UNCONDITIONAL}", BOOLEAN, shown=_tolerant, text=True),
    ApiField("hang_restart", f"{ANNOTATIONS}.{HANG_RETRY}", BOOLEAN, shown=_tolerant, text=True),
    ApiField(
        "pod_retry_num",
        f"{ANNOTATIONS}.{POD_RETRY_NUM}",
        INTEGER,
        shown=_tolerant,
        text=True,
        **_between(0, v.POD_RETRY_MAX),
    ),
    ApiField(
        "operator_reexecution",
        f"{ANNOTATIONS}.{OPERATOR_REEXECUTION}",
        BOOLEAN,
        shown=lambda job: job.operator_reexecution,
        text=True,
    ),
    ApiField("training_mode", "algorithm.training_mode", STRING),
    ApiField("base_model", "algorithm.base_model", NAME),
    # A template fills what the body leaves empty (PresetTemplate.apply_template), it is not set.
    ApiField("preset_template", "algorithm.template", NAME, parsed=False),
    ApiField("command", "algorithm.command", STRING),
    ApiField(
        "image_source",
        ENGINE,
        SHAPED,
        schema={"type": "object", "description": "A preset image (engine_name) or a custom one (image_url)."},
    ),
    ApiField(
        "preset_image",
        f"{ENGINE}.engine_name",
        NAME,
        shown=lambda job: job.image_source == TrainingJob.ImageSource.PRESET and bool(job.preset_image_id),
    ),
    # Read only for a custom image: with an engine_name the preset image's own reference is used.
    ApiField("image", f"{ENGINE}.image_url", STRING, within="custom_image"),
    ApiField("image_kind", f"{ENGINE}.image_kind", STRING, within="custom_image", empty_is_null=True),
    ApiField("code_dir", "algorithm.code_dir", STRING, empty_is_null=True),
    ApiField("code_backup_dir", "algorithm.code_backup_dir", STRING, empty_is_null=True),
    ApiField("local_code_dir", "algorithm.local_code_dir", STRING),
    ApiField(
        "environments",
        "algorithm.environments",
        SHAPED,
        schema={"oneOf": [_OBJECTS, {"type": "object", "additionalProperties": {"type": "string"}}]},
    ),
    ApiField("datasets", "algorithm.inputs", SHAPED, schema=_OBJECTS),
    ApiField("store_artifacts", "algorithm.outputs", SHAPED, schema=_OBJECTS),
    ApiField("artifact_path", f"{OUTPUT}.remote.obs.obs_url", STRING, within=OUTPUT),
    ApiField("artifact_mount_path", f"{OUTPUT}.local_dir", STRING, within=OUTPUT),
    ApiField("pool_type", "spec.resource.pool_type", STRING),
    ApiField("pool", "spec.resource.pool_id", NAME),
    ApiField("flavor", "spec.resource.flavor_id", NAME),
    ApiField("node_count", "spec.resource.node_count", INTEGER, **_between(v.NODE_COUNT_MIN, v.NODE_COUNT_MAX)),
    ApiField("spec_type", CUSTOM_SPEC, SHAPED, schema={"type": "object"}),
    ApiField("custom_cpus", f"{CUSTOM_SPEC}.cpu", NUMBER, within=CUSTOM_SPEC),
    ApiField("custom_memory_gb", f"{CUSTOM_SPEC}.memory_gb", NUMBER, within=CUSTOM_SPEC),
    ApiField("custom_gpus", f"{CUSTOM_SPEC}.gpu", INTEGER, within=CUSTOM_SPEC),
    ApiField("affinity", f"{AFFINITY}.type", STRING, within=AFFINITY),
    ApiField("affinity_strength", f"{AFFINITY}.strength", STRING, within=AFFINITY),
    ApiField(
        "affinity_hosts",
        f"{AFFINITY}.hosts",
        ARRAY,
        within=AFFINITY,
        schema={"type": "array", "items": {"type": "string"}},
    ),
    ApiField("file_system_mounts", "spec.volumes", SHAPED, schema=_OBJECTS),
    ApiField("obs_mounts", "spec.volumes", SHAPED, schema=_OBJECTS),
    ApiField("priority", "spec.schedule_policy.priority", INTEGER, **_between(v.PRIORITY_MIN, v.PRIORITY_MAX)),
    ApiField("preemptible", "spec.schedule_policy.preemptible", BOOLEAN),
    ApiField("keep_logs", "spec.keep_logs", BOOLEAN),
    ApiField(
        "log_export_path",
        "spec.log_export_path",
        SHAPED,
        schema={
            "oneOf": [{"type": "object", "properties": {"obs_url": {"type": "string"}}}, {"type": "string"}],
            "nullable": True,  # GET: null when no log path is set
        },
    ),
    ApiField("log_time_range_download", "spec.log_time_range_download", BOOLEAN),
    ApiField("auto_stop_hours", "spec.auto_stop_hours", INTEGER, **_HOURS),
    ApiField("retention_hours", "spec.retention_hours", INTEGER, **_HOURS),
    ApiField("auto_publish", PUBLISH, SHAPED, schema={"type": "object"}),
    ApiField("publish_as", f"{PUBLISH}.as", STRING, within=PUBLISH, parsed=False),
    # One path, two fields: the name of a new model, or of the existing model a version is added to.
    ApiField(
        "model_name", f"{PUBLISH}.model_name", STRING, within="new_model", shown=lambda job: not _existing_model(job)
    ),
    ApiField("publish_model", f"{PUBLISH}.model_name", NAME, within="existing_model", shown=_existing_model),
    ApiField("model_type", f"{PUBLISH}.model_type", STRING, within=PUBLISH, empty_is_null=True),
    ApiField("model_brand", f"{PUBLISH}.model_brand", STRING, within=PUBLISH),
    ApiField("model_description", f"{PUBLISH}.model_description", STRING, within=PUBLISH),
    ApiField("version_description", f"{PUBLISH}.version_description", STRING, within=PUBLISH),
    ApiField("jupyter_lab", f"{ACCESS}.jupyter_lab", BOOLEAN),
    ApiField("ssh_remote", f"{ACCESS}.ssh", BOOLEAN),
    ApiField("ssh_key_pair", f"{ACCESS}.key_pair", NAME),
    ApiField("mutual_trust", f"{ACCESS}.mutual_trust", BOOLEAN),
    ApiField("mutual_trust_dir", f"{ACCESS}.mutual_trust_dir", STRING),
    ApiField("tensorboard", f"{OBSERVE}.tensorboard", BOOLEAN),
    ApiField("mindstudio_insight", f"{OBSERVE}.mindstudio_insight", BOOLEAN),
    ApiField("observe_file_system", f"{OBSERVE}.file_system", NAME),
    ApiField("observe_path", f"{OBSERVE}.path", STRING),
    ApiField("metrics_mode", f"{PROMETHEUS}.type", STRING, within=PROMETHEUS),
    _prometheus("metrics_path", "path", STRING, "http"),
    _prometheus("metrics_port", "port", INTEGER, "http", **_between(v.PORT_MIN, v.PORT_MAX)),
    _prometheus("metrics_command", "command", STRING, "command"),
    _prometheus("metrics_args", "args", STRING, "command"),
    ApiField(
        "hang_window_s",
        "spec.hang_detection.window_seconds",
        INTEGER,
        minimum=0,
        rule=_(" of seconds (0: the platform default)"),
        empty_is_null=True,
    ),
    ApiField("notify_webhook_url", f"{NOTIFICATION}.webhook_url", STRING),
    ApiField(
        "notify_emails",
        f"{NOTIFICATION}.emails",
        SHAPED,
        schema={"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string", "format": "email"}}]},
    ),
    ApiField("notify_events", f"{NOTIFICATION}.events", ARRAY, schema={"type": "array", "items": {"type": "string"}}),
)
API_FIELD = {f.field: f for f in API_FIELDS}

# Model field -> where it lives in the API body (errors are keyed by it).
FIELD_PATHS = {f.field: f.path for f in API_FIELDS} | {NON_FIELD_ERRORS: "body"}
