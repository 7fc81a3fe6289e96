"""Each training-job field is declared once (issue 11): the model field carries its label and
help text, the API's path table (jobs/api/serializers.py API_FIELDS) its place in the body.

These tests fail when a form, the response or the OpenAPI schema says something of its own
about a field instead of taking it from there.
"""

from __future__ import annotations

from django.utils.functional import Promise
from django.utils.text import capfirst

from jobs import validators as v
from jobs.api import schema
from jobs.api.representations import job_fields
from jobs.api.serializers import API_FIELD, API_FIELDS, FIELD_PATHS
from jobs.forms import ROWS_HINT, JobCreateForm, RowsField
from jobs.models import TrainingJob

MODEL_FIELDS = {f.name for f in TrainingJob._meta.fields}


def form_model_fields() -> dict:
    return {name: field for name, field in JobCreateForm.base_fields.items() if name in MODEL_FIELDS}


def test_the_form_declares_no_labels_or_help_texts_of_its_own():
    meta = JobCreateForm._meta
    assert not meta.labels and not meta.help_texts


def test_form_labels_and_help_texts_are_the_models():
    fields = form_model_fields()
    assert set(JobCreateForm.Meta.fields) <= set(fields)
    for name, form_field in fields.items():
        model_field = TrainingJob._meta.get_field(name)
        assert str(form_field.label) == str(capfirst(model_field.verbose_name)), name
        help_text = str(model_field.help_text)
        if isinstance(form_field, RowsField):  # the row editor's own hint follows the model's text
            help_text = f"{help_text} {ROWS_HINT}"
        assert str(form_field.help_text) == help_text, name


def test_every_form_field_has_a_translatable_label_and_help_text():
    for name in form_model_fields():
        model_field = TrainingJob._meta.get_field(name)
        assert isinstance(model_field.verbose_name, Promise), f"{name}: verbose_name not wrapped in _()"
        assert model_field.help_text, f"{name} has no help text"


def test_wizard_labels_stay_as_they_were():
    labels = {name: str(field.label) for name, field in JobCreateForm.base_fields.items()}
    assert labels["command"] == "Start command"
    assert labels["node_count"] == "Instance count"
    assert labels["fault_tolerance"] == "Fault tolerance (automatic restart)"
    assert labels["jupyter_lab"] == "JupyterLab"
    assert labels["notify_emails"] == "E-mail addresses"
    assert labels["keep_logs"] == "Keep logs permanently"


def test_help_texts_take_limits_from_the_validators():
    def help_text(name: str) -> str:
        return str(TrainingJob._meta.get_field(name).help_text)

    assert help_text("node_count").startswith(f"{v.NODE_COUNT_MIN}-{v.NODE_COUNT_MAX};")
    assert help_text("max_restarts").startswith(f"{v.MAX_RESTARTS_MIN}-{v.MAX_RESTARTS_MAX},")
    assert f"{v.CODE_DIR_MAX_FILES} files, {v.CODE_DIR_MAX_DEPTH} levels" in help_text("code_dir")
    assert f"{v.HOURS_MIN}-{v.HOURS_MAX} hours" in help_text("auto_stop_hours")
    assert f"At most {v.ENV_MAX};" in help_text("environments")


def test_the_path_table_is_the_api_error_map():
    assert {name: path for name, path in FIELD_PATHS.items() if name != "__all__"} == {
        spec.field: spec.path for spec in API_FIELDS
    }
    assert set(API_FIELD) <= set(JobCreateForm.base_fields)


def _property(tree: dict, path: str) -> dict:
    node = {"properties": tree}
    for key in path.split("."):
        node = node["items"] if key.isdigit() else node["properties"][key]
    return node


def test_every_path_table_field_is_in_the_schema_with_the_models_help_text():
    shared = {}  # a path two fields share is described by the first of them
    for spec in API_FIELDS:
        described = _property(schema.FIELDS, spec.path)
        first = shared.setdefault(spec.path, spec.field)
        if first == spec.field:
            assert described.get("description") == str(spec.model_field.help_text), spec.field
        for limit in ("minimum", "maximum"):
            if getattr(spec, limit) is not None and not spec.text:
                assert described[limit] == getattr(spec, limit), spec.field
    create = schema.CREATE_BODY["properties"]
    assert _property(create, "metadata.name")["maxLength"] == v.JOB_NAME_MAX
    assert _property(create, "spec.resource.node_count")["maximum"] == v.NODE_COUNT_MAX
    assert _property(create, "spec.schedule_policy.priority")["maximum"] == v.PRIORITY_MAX
    job = schema.JOB["properties"]
    for spec in API_FIELDS:
        _property(job, spec.path)  # the response describes every field too


def _everything_on() -> TrainingJob:
    """A job for which GET shows every field of the table (no database needed)."""
    return TrainingJob(
        name="all",
        pool_type=TrainingJob.PoolType.DEDICATED,
        spec_type=TrainingJob.SpecType.CUSTOM,
        custom_cpus=2,
        custom_memory_gb=4,
        custom_gpus=0,
        affinity=TrainingJob.Affinity.AFFINITY,
        affinity_hosts=["h1"],
        store_artifacts=True,
        artifact_path="obs://bucket/out/",
        auto_publish=True,
        model_name="my-model",
        metrics_mode=TrainingJob.MetricsMode.HTTP,
        metrics_path="/metrics",
        metrics_port=9100,
        fault_tolerance=True,
        operator_reexecution=True,
        keep_logs=True,
    )


def _at(body: dict, path: str):
    node = body
    for key in path.split("."):
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


def test_every_path_table_field_is_in_the_representation():
    body = job_fields(_everything_on())
    # Shown in other cases: metrics by command, a version of an existing model, fault tolerance
    # (its max_restarts shows it), a preset image and the shapes built around other fields.
    elsewhere = {"metrics_command", "metrics_args", "publish_model", "preset_image"}
    elsewhere |= {"fault_tolerance", "spec_type", "auto_publish"}
    for spec in API_FIELDS:
        if spec.field not in elsewhere:
            _at(body, spec.path)  # KeyError: the response leaves the field out
    command = _everything_on()
    command.metrics_mode = TrainingJob.MetricsMode.COMMAND
    assert set(job_fields(command)["spec"]["observe"]["prometheus"]) == {"type", "command", "args"}
