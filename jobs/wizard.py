"""The create-job wizard's structure: steps in the seed's order, which fields depend on which,
and the high-availability scenario presets of seed 003.

Nothing here validates: every rule is TrainingJob.clean() (through JobCreateForm), shared
with the API. This module only says where a field is shown and when.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.http import QueryDict
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


@dataclass(frozen=True)
class Step:
    slug: str
    title: str
    fields: tuple[str, ...]
    intro: str = ""


STEPS: tuple[Step, ...] = (
    Step(
        "mode",
        _("Training mode"),
        ("workspace", "training_mode", "base_model"),
        _("A custom job runs your own code; a fine-tuning job starts from a preset template or one of your models."),
    ),
    Step("basic", _("Basic information"), ("name", "description")),
    Step(
        "training",
        _("Training configuration"),
        (
            "preset_template",
            "image_source",
            "preset_image",
            "image",
            "image_kind",
            "command",
            "code_dir",
            "code_backup_dir",
            "local_code_dir",
            "environments",
            "env_file",
        ),
    ),
    Step(
        "resources",
        _("Resources"),
        (
            "pool_type",
            "pool",
            "spec_type",
            "flavor",
            "custom_cpus",
            "custom_memory_gb",
            "custom_gpus",
            "node_count",
            "affinity",
            "affinity_strength",
            "affinity_hosts",
            "file_system_mounts",
            "obs_mounts",
            "priority",
            "preemptible",
        ),
    ),
    Step("data", _("Data"), ("datasets",), _("Up to 3 datasets: preset data, or your own online data.")),
    Step(
        "artifacts",
        _("Training artifacts"),
        (
            "store_artifacts",
            "artifact_path",
            "artifact_mount_path",
            "auto_publish",
            "publish_as",
            "model_name",
            "model_type",
            "model_brand",
            "model_description",
            "publish_model",
            "version_description",
        ),
        _("Outputs kept in object storage; the artifact mount survives restarts, so keep checkpoints there."),
    ),
    Step(
        "ha",
        _("High availability"),
        (
            "fault_tolerance",
            "max_restarts",
            "unconditional_restart",
            "hang_restart",
            "pod_retry_num",
            "operator_reexecution",
            "hang_window_s",
        ),
        _("What happens when the job fails or hangs. A scenario preset (beside the form) fills these."),
    ),
    Step("access", _("Access"), ("jupyter_lab", "ssh_remote", "ssh_key_pair", "mutual_trust", "mutual_trust_dir")),
    Step(
        "observe",
        _("Observability"),
        (
            "tensorboard",
            "mindstudio_insight",
            "observe_file_system",
            "observe_path",
            "metrics_mode",
            "metrics_path",
            "metrics_port",
            "metrics_command",
            "metrics_args",
        ),
    ),
    Step(
        "more",
        _("More settings"),
        (
            "keep_logs",
            "log_export_path",
            "log_time_range_download",
            "visibility",
            "auto_stop_hours",
            "retention_hours",
            "tags",
            "notify_webhook_url",
            "notify_emails",
            "notify_events",
        ),
    ),
    Step("review", _("Review and submit"), ()),
)
STEP_BY_SLUG = {step.slug: step for step in STEPS}
FIRST_STEP = STEPS[0].slug
REVIEW = "review"
STEP_OF_FIELD = {name: step.slug for step in STEPS for name in step.fields}

# When a field is shown (SPEC §3 and the seed): alternatives joined by " | ", each either
# "field" (set: a checked box, a non-empty choice) or "field=value". A hidden field's own
# value counts as empty, so a chain (auto_publish -> publish_as -> model_name) hides as a whole.
# Hidden fields are disabled in the page, so the browser does not post them: a value typed
# before switching, e.g., to the public pool is not sent (and not refused).
SHOW_WHEN: dict[str, str] = {
    "base_model": "training_mode=finetune",
    "preset_image": "image_source=preset",
    "image": "image_source=custom",
    "image_kind": "image_source=custom",
    "pool": "pool_type=dedicated",
    "spec_type": "pool_type=dedicated",
    "flavor": "pool_type=public | spec_type=preset",
    "custom_cpus": "spec_type=custom",
    "custom_memory_gb": "spec_type=custom",
    "custom_gpus": "spec_type=custom",
    "affinity": "pool_type=dedicated",
    "affinity_strength": "affinity",
    "affinity_hosts": "affinity",
    "file_system_mounts": "pool_type=dedicated",
    "obs_mounts": "pool_type=dedicated",
    "priority": "pool_type=dedicated",
    "preemptible": "pool_type=dedicated",
    "artifact_path": "store_artifacts",
    "artifact_mount_path": "store_artifacts",
    "publish_as": "auto_publish",
    "version_description": "auto_publish",
    "model_name": "publish_as=new",
    "model_type": "publish_as=new",
    "model_brand": "publish_as=new",
    "model_description": "publish_as=new",
    "publish_model": "publish_as=version",
    "max_restarts": "fault_tolerance",
    "unconditional_restart": "fault_tolerance",
    "hang_restart": "fault_tolerance",
    "pod_retry_num": "fault_tolerance",
    "ssh_key_pair": "ssh_remote",
    "mutual_trust_dir": "mutual_trust",
    "tensorboard": "pool_type=dedicated",
    "mindstudio_insight": "pool_type=dedicated",
    "observe_file_system": "tensorboard | mindstudio_insight",
    "observe_path": "tensorboard | mindstudio_insight",
    "metrics_path": "metrics_mode=http",
    "metrics_port": "metrics_mode=http",
    "metrics_command": "metrics_mode=command",
    "metrics_args": "metrics_mode=command",
    "log_export_path": "keep_logs",
    "retention_hours": "pool_type=dedicated",
}


def as_text(value) -> str:
    """A field's value as the page's script sees it: a checked box is "on", nothing is ""."""
    if value is True:
        return "on"
    if value in (None, False):
        return ""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def visible_fields(value_of: Callable[[str], object]) -> set[str]:
    """The fields shown for these values (value_of(name) -> the field's current value)."""
    memo: dict[str, bool] = {}

    def shown(name: str) -> bool:
        if name not in memo:
            memo[name] = True  # no cycles in SHOW_WHEN; this guards against one anyway
            rule = SHOW_WHEN.get(name)
            memo[name] = rule is None or any(holds(term.strip()) for term in rule.split("|"))
        return memo[name]

    def holds(term: str) -> bool:
        controller, _, wanted = term.partition("=")
        if not shown(controller):
            return False
        value = as_text(value_of(controller))
        return value == wanted if wanted else value not in ("", "0", "false")

    return {name for name in STEP_OF_FIELD if shown(name)}


def next_step(slug: str) -> str:
    slugs = [s.slug for s in STEPS]
    return slugs[min(slugs.index(slug) + 1, len(slugs) - 1)]


def previous_step(slug: str) -> str:
    slugs = [s.slug for s in STEPS]
    return slugs[max(slugs.index(slug) - 1, 0)]


def first_step_with_errors(error_fields: Iterable[str]) -> str:
    steps = {STEP_OF_FIELD.get(name, REVIEW) for name in error_fields}
    for step in STEPS:
        if step.slug in steps:
            return step.slug
    return REVIEW


# -- scenario presets (seed 003, table 1) ----------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    slug: str
    title: str
    suits: str
    values: dict[str, object]
    checklist: tuple[str, ...]
    features: tuple[tuple[str, str], ...] = field(default=())


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "single_node",
        _("Single node"),
        _("One node, one or more cards."),
        {
            "node_count": 1,
            "fault_tolerance": True,
            "max_restarts": 3,
            "unconditional_restart": False,
            "hang_restart": False,
            "pod_retry_num": 0,
            "operator_reexecution": False,
        },
        (
            _("A checkpoint path is configured (the artifact mount or a file system mount)."),
            _("The training script resumes from the last checkpoint."),
            _("Automatic restart is on."),
            _("Max restarts is set to a sensible number."),
            _("After a failure, the log's failure analysis (Fault recovery tab) says why."),
        ),
        (
            (_("Resume from checkpoint"), pgettext_lazy("scenario feature", "recommended")),
            (_("Automatic restart"), pgettext_lazy("scenario feature", "recommended")),
            (_("Hang detection"), pgettext_lazy("scenario feature", "optional")),
            (_("Hang restart"), pgettext_lazy("scenario feature", "optional")),
            (_("Operator re-execution"), pgettext_lazy("scenario feature", "usually not needed")),
        ),
    ),
    Scenario(
        "multi_node",
        _("Multi-node multi-card"),
        _("Distributed training, large GPU/NPU jobs."),
        {
            "node_count": 2,
            "fault_tolerance": True,
            "max_restarts": 10,
            "unconditional_restart": True,
            "hang_restart": True,
            "pod_retry_num": 1,
            "operator_reexecution": False,
        },
        (
            _("The training script saves and resumes checkpoints."),
            _("Checkpoints are saved to reliable shared storage."),
            _("The training script can be started again (it is re-entrant)."),
            _("Automatic restart is on."),
            _("Unconditional restart is on where the job needs it."),
            _("Hang detection is on."),
            _("Hang restart is on for long-running jobs."),
            _("Recoveries are watched through events, logs and the Fault recovery tab."),
        ),
        (
            (_("Resume from checkpoint"), pgettext_lazy("scenario feature", "required")),
            (_("Automatic restart"), pgettext_lazy("scenario feature", "recommended")),
            (_("Unconditional restart"), pgettext_lazy("scenario feature", "recommended")),
            (_("Hang detection"), pgettext_lazy("scenario feature", "recommended")),
            (_("Hang restart"), pgettext_lazy("scenario feature", "recommended")),
            (_("Instance rescheduling"), pgettext_lazy("scenario feature", "depends on the pool")),
            (_("Job rescheduling off faulty hosts"), pgettext_lazy("scenario feature", "depends on the pool")),
        ),
    ),
    Scenario(
        "long_running",
        _("Long-running large-model training"),
        _("Pre-training, fine-tuning, RL: long jobs on many resources."),
        {
            "fault_tolerance": True,
            "max_restarts": 20,
            "unconditional_restart": True,
            "hang_restart": True,
            "pod_retry_num": 1,
            "operator_reexecution": False,
        },
        (
            _("Checkpoints go to stable shared storage."),
            _("Model, optimizer, LR scheduler and random states are saved regularly."),
            _("The job resumes automatically from the latest complete checkpoint."),
            _("Automatic restart and fault recovery are on."),
            _("Hang detection and hang restart are on."),
            _("Operator re-execution is evaluated for the hardware (Ascend super-nodes)."),
            _("Logs, events and failure analysis are watched as one loop."),
        ),
        (
            (_("Resume from checkpoint"), pgettext_lazy("scenario feature", "required")),
            (_("Automatic restart"), pgettext_lazy("scenario feature", "required")),
            (_("Unconditional restart"), pgettext_lazy("scenario feature", "recommended")),
            (_("Hang detection"), pgettext_lazy("scenario feature", "recommended")),
            (_("Hang restart"), pgettext_lazy("scenario feature", "recommended")),
            (
                _("Operator re-execution"),
                pgettext_lazy("scenario feature", "recommended on specific Ascend super-nodes"),
            ),
            (_("Log failure analysis"), pgettext_lazy("scenario feature", "recommended")),
        ),
    ),
)
SCENARIO_BY_SLUG = {s.slug: s for s in SCENARIOS}


def apply_values(data: QueryDict, values: dict[str, object]) -> None:
    """Set fields in posted data as the browser would post them (a checked box is "on")."""
    for name, value in values.items():
        if value is True:
            data[name] = "on"
        elif value is False or value is None:
            data.pop(name, None)
        elif isinstance(value, list):
            data.setlist(name, [str(v) for v in value])
        else:
            data[name] = str(value)


def set_rows(data: QueryDict, name: str, rows: list[dict]) -> None:
    """Replace a row field's posted rows (`<name>-<i>-<column>`)."""
    for key in [k for k in data if k.startswith(f"{name}-")]:
        del data[key]
    data.pop(name, None)
    for index, row in enumerate(rows):
        for column, value in row.items():
            if value is True:
                data[f"{name}-{index}-{column}"] = "on"
            elif value not in (False, None):
                data[f"{name}-{index}-{column}"] = str(value)
