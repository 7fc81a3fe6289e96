"""The same values as the form's POST data and as the API body (for test_spec_limits.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils.datastructures import MultiValueDict
from rest_framework.test import APIClient

from jobs.forms import JobCreateForm
from jobs.models import (
    TrainingJob,
)
from tests.helpers import BUSYBOX

RETRY = "fault-tolerance/job-retry-num"
UNCONDITIONAL = "fault-tolerance/job-unconditional-retry"
HANG = "fault-tolerance/hang-retry"
POD_RETRY = "fault-tolerance/pod-retry-num"
OPERATOR = "fault-tolerance/operator-reexecution"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB7Jm2oXb3mQyq1n6D1pQWJb2bq2L3m3s0l6G4c6Zf8Q owner@laptop"
GB = 1024**3


# -- the world: pools, flavors, images, file systems, data, models, key pairs ---------------------------------
@dataclass
class World:
    demo: object
    datasets: dict[str, int] = field(default_factory=dict)

    @property
    def owner(self):
        return self.demo.owner


# -- one set of values -> the form's POST data and the API body ---------------------------------------------
BASE = {"name": "spec-job", "command": "echo hi", "image": BUSYBOX}
DEDICATED = {"pool_type": "dedicated", "pool": "ded", "flavor": "cpu-small"}
ROWS = ("environments", "tags", "file_system_mounts", "obs_mounts")
MULTI = ("datasets", "affinity_hosts", "notify_events")


def to_form(w: World, values: dict) -> MultiValueDict:
    data = MultiValueDict({"workspace": [str(w.demo.workspace.pk)]})
    for key, value in values.items():
        if key in ROWS:
            for i, row in enumerate(value):
                for column, item in row.items():
                    if item is True:
                        data[f"{key}-{i}-{column}"] = "on"
                    elif item is not False:
                        data[f"{key}-{i}-{column}"] = str(item)
        elif key in MULTI:
            items = [w.datasets[d] for d in value] if key == "datasets" else value
            data.setlist(key, [str(i) for i in items])
        elif value is True:
            data[key] = "on"
        elif value is False:
            continue  # an unchecked checkbox posts nothing
        else:
            data[key] = "" if value is None else str(value)
    return data


def to_body(w: World, values: dict) -> dict:
    x = dict(values)
    annotations: dict = {}
    metadata: dict = {"annotations": annotations}
    algorithm: dict = {}
    resource: dict = {}
    spec: dict = {"resource": resource}
    for key in ("name", "description", "visibility", "tags"):
        if key in x:
            metadata[key] = x[key]
    if x.get("fault_tolerance"):
        annotations[RETRY] = str(x.get("max_restarts", 3))
    for key, annotation in [
        ("unconditional_restart", UNCONDITIONAL),
        ("hang_restart", HANG),
        ("operator_reexecution", OPERATOR),
    ]:
        if key in x:
            annotations[annotation] = str(x[key]).lower()
    if "pod_retry_num" in x:
        annotations[POD_RETRY] = str(x["pod_retry_num"])
    for key, name in [
        ("training_mode", "training_mode"),
        ("base_model", "base_model"),
        ("preset_template", "template"),
        ("command", "command"),
        ("code_dir", "code_dir"),
        ("code_backup_dir", "code_backup_dir"),
        ("local_code_dir", "local_code_dir"),
        ("environments", "environments"),
    ]:
        if key in x:
            algorithm[name] = x[key]
    if x.get("image_source") == "preset":
        algorithm["engine"] = {"engine_name": x.get("preset_image")}
    else:
        algorithm["engine"] = {"image_url": x.get("image", "")}
        if "image_kind" in x:
            algorithm["engine"]["image_kind"] = x["image_kind"]
    if "datasets" in x:
        algorithm["inputs"] = [{"remote": {"dataset": {"id": w.datasets[d]}}} for d in x["datasets"]]
    if x.get("store_artifacts"):
        output = {"name": "artifacts", "remote": {"obs": {"obs_url": x.get("artifact_path", "")}}}
        if "artifact_mount_path" in x:
            output["local_dir"] = x["artifact_mount_path"]
        algorithm["outputs"] = [output]
    for key, name in [
        ("pool_type", "pool_type"),
        ("pool", "pool_id"),
        ("flavor", "flavor_id"),
        ("node_count", "node_count"),
    ]:
        if key in x:
            resource[name] = x[key]
    if x.get("spec_type") == "custom":
        resource["custom_spec"] = {"cpu": x.get("custom_cpus"), "memory_gb": x.get("custom_memory_gb")}
        if "custom_gpus" in x:
            resource["custom_spec"]["gpu"] = x["custom_gpus"]
    if x.get("affinity"):
        resource["affinity"] = {
            "type": x["affinity"],
            "strength": x.get("affinity_strength", "required"),
            "hosts": x.get("affinity_hosts", []),
        }
    volumes = [
        {
            "file_system": {
                "name": m.get("file_system"),
                "path": m.get("path", "/"),
                "local_path": m.get("mount_path"),
                "read_only": m.get("read_only", False),
                "mount_options": m.get("options", ""),
            }
        }
        for m in x.get("file_system_mounts", [])
    ] + [{"obs": {"obs_url": m["obs_url"], "local_path": m["mount_path"]}} for m in x.get("obs_mounts", [])]
    if volumes:
        spec["volumes"] = volumes
    policy = {k: x[k] for k in ("priority", "preemptible") if k in x}
    if policy:
        spec["schedule_policy"] = policy
    for key in ("keep_logs", "log_time_range_download", "auto_stop_hours", "retention_hours"):
        if key in x:
            spec[key] = x[key]
    if x.get("log_export_path"):
        spec["log_export_path"] = {"obs_url": x["log_export_path"]}
    if x.get("auto_publish"):
        publish = {"as": x.get("publish_as", "new")}
        publish["model_name"] = x.get("publish_model") if publish["as"] == "version" else x.get("model_name", "")
        for key in ("model_type", "model_brand", "model_description", "version_description"):
            if key in x:
                publish[key] = x[key]
        spec["publish"] = publish
    access = {
        name: x[key]
        for key, name in [
            ("jupyter_lab", "jupyter_lab"),
            ("ssh_remote", "ssh"),
            ("ssh_key_pair", "key_pair"),
            ("mutual_trust", "mutual_trust"),
            ("mutual_trust_dir", "mutual_trust_dir"),
        ]
        if key in x
    }
    if access:
        spec["access"] = access
    observe = {
        name: x[key]
        for key, name in [
            ("tensorboard", "tensorboard"),
            ("mindstudio_insight", "mindstudio_insight"),
            ("observe_file_system", "file_system"),
            ("observe_path", "path"),
        ]
        if key in x
    }
    if x.get("metrics_mode"):
        observe["prometheus"] = {
            name: x[key]
            for key, name in [
                ("metrics_mode", "type"),
                ("metrics_path", "path"),
                ("metrics_port", "port"),
                ("metrics_command", "command"),
                ("metrics_args", "args"),
            ]
            if key in x
        }
    if observe:
        spec["observe"] = observe
    return {"kind": "job", "metadata": metadata, "algorithm": algorithm, "spec": spec}


def form_for(w: World, values: dict, files: dict | None = None, user=None) -> JobCreateForm:
    user = user or w.owner
    form = JobCreateForm(to_form(w, values), files or {}, user=user)
    form.instance.created_by = user
    return form


def jobs_url(w: World) -> str:
    return f"/v2/{w.demo.workspace.project_id}/training-jobs"


def both_refuse(w: World, api: APIClient, values: dict) -> tuple[dict, dict]:
    """The form's errors and the API's errors for the same values; both must create nothing."""
    before = TrainingJob.objects.count()
    form = form_for(w, values)
    assert not form.is_valid(), "the form accepted it"
    response = api.post(jobs_url(w), to_body(w, values), format="json")
    assert response.status_code == 400, response.content
    assert TrainingJob.objects.count() == before
    return {k: list(messages) for k, messages in form.errors.items()}, response.json()["errors"]


def both_accept(w: World, api: APIClient, values: dict) -> dict:
    form = form_for(w, values)
    assert form.is_valid(), form.errors.as_data()
    response = api.post(jobs_url(w), to_body(w, values), format="json")
    assert response.status_code == 201, response.json()
    return response.json()  # never started: its start is dispatched on a commit the test never makes
