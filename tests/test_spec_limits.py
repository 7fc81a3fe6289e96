"""SPEC §3, every row: one table of values drives BOTH the wizard's form and the API.

For each case the same values become the form's POST data and the ModelArts v2 body;
both must refuse with the same message (form field error == API errors[path]), create
nothing, and both must accept the edge just inside the limit. The code dir limits are
checked against real folders in a local object storage root (sparse files for 5 GB).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils.datastructures import MultiValueDict
from rest_framework.test import APIClient

from jobs import storage
from jobs import validators as v
from jobs.api.serializers import FIELD_PATHS
from jobs.forms import JobCreateForm
from jobs.models import (
    Dataset,
    DockerHost,
    FileSystem,
    Flavor,
    KeyPair,
    Model,
    PresetImage,
    PresetTemplate,
    ResourcePool,
    TrainingJob,
)
from tests.conftest import BUSYBOX

pytestmark = pytest.mark.django_db(transaction=True)

RETRY = "fault-tolerance/job-retry-num"
UNCONDITIONAL = "fault-tolerance/job-unconditional-retry"
HANG = "fault-tolerance/hang-retry"
POD_RETRY = "fault-tolerance/pod-retry-num"
OPERATOR = "fault-tolerance/operator-reexecution"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB7Jm2oXb3mQyq1n6D1pQWJb2bq2L3m3s0l6G4c6Zf8Q owner@laptop"
GB = 1024**3


# -- the object storage tree (built once: real folders, sparse files for the 5 GB edge) ------------------------
def _files(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for i in range(count):
        (folder / f"f{i}.py").write_bytes(b"")


def _deep(folder: Path, depth: int) -> None:
    """A file at `depth` levels below `folder` (a file directly in it is depth 1)."""
    leaf = folder.joinpath(*[f"d{i}" for i in range(depth - 1)])
    leaf.mkdir(parents=True)
    (leaf / "train.py").write_text("print('deep')\n")


def _sized(folder: Path, size: int) -> None:
    folder.mkdir(parents=True)
    with open(folder / "weights.bin", "wb") as f:
        f.truncate(size)  # sparse: the size is real to stat(), no disk is used


@pytest.fixture(scope="module")
def obs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("object-storage")
    bucket = root / "bucket"
    (bucket / "code").mkdir(parents=True)
    (bucket / "code" / "train.py").write_text("print('hi')\n")
    for name in ("out", "logs", "data", "backup"):
        (bucket / name).mkdir()
    _files(bucket / "files-1000", 1000)
    _files(bucket / "files-1001", 1001)
    _deep(bucket / "depth-32", 32)
    _deep(bucket / "depth-33", 33)
    _sized(bucket / "size-5g", 5 * GB)
    _sized(bucket / "size-over", 5 * GB + 1)
    return root


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """The demo's users are created with a cheap hasher: this file makes a few hundred of them."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# -- the world: pools, flavors, images, file systems, data, models, key pairs ---------------------------------
@dataclass
class World:
    demo: object
    datasets: dict[str, int] = field(default_factory=dict)

    @property
    def owner(self):
        return self.demo.owner


@pytest.fixture
def world(demo, settings, obs_root) -> World:
    settings.OBJECT_STORAGE_ROOT = str(obs_root)
    dedicated = ResourcePool.objects.create(
        name="ded", kind=ResourcePool.Kind.DEDICATED, node_cpus=8, node_memory_gb=32, node_gpus=2
    )
    # Affinity targets only: disabled, so no worker ever places an instance on them.
    DockerHost.objects.create(name="ded-1", base_url="tcp://192.0.2.1:2375", pool=dedicated, enabled=False)
    DockerHost.objects.create(name="ded-2", base_url="tcp://192.0.2.2:2375", pool=dedicated, enabled=False)
    Flavor.objects.create(name="cpu-small", cpus=1, memory_mb=2048)
    Flavor.objects.create(name="cpu-huge", cpus=16, memory_mb=2048)
    Flavor.objects.create(name="gpu-1", cpus=2, memory_mb=4096, gpus=1)
    Flavor.objects.create(name="GPU:1*tnt004", cpus=2, memory_mb=4096, gpus=1, single_process=True)
    Flavor.objects.create(name="npu-1", cpus=2, memory_mb=4096, gpus=1, npu=True)
    PresetImage.objects.filter(name="busybox").update(kind="cpu")
    PresetImage.objects.create(name="busybox-gpu", image_ref=BUSYBOX, kind="gpu")
    FileSystem.objects.create(name="fs1", kind=FileSystem.Kind.NFS, source="10.0.0.1:/export")
    FileSystem.objects.create(name="hostfs", kind=FileSystem.Kind.HOST_DIR, source="/srv/shared")
    w = World(demo)
    for name, owner, online in [
        ("preset-1", None, True),
        ("preset-2", None, True),
        ("preset-3", None, True),
        ("mine", demo.owner, True),
        ("mine-offline", demo.owner, False),
        ("theirs", demo.member, True),
    ]:
        w.datasets[name] = Dataset.objects.create(name=name, owner=owner, online=online, path="obs://bucket/data/").id
    Model.objects.create(owner=demo.owner, name="existing-model", type="text_generation", description="v1 exists")
    Model.objects.create(owner=demo.member, name="their-model", type="other", description="not the owner's")
    KeyPair.objects.create(owner=demo.owner, name="laptop", public_key=KEY)
    KeyPair.objects.create(owner=demo.member, name="their-key", public_key=KEY)
    PresetTemplate.objects.create(
        name="qwen-sft",
        type=PresetTemplate.Type.TEXT_GENERATION,
        brand="Qwen",
        description="Qwen fine-tuning",
        image=PresetImage.objects.get(name="busybox"),
        command="echo template",
        code_dir="obs://bucket/code/",
        environments=[{"name": "MODEL", "value": "qwen", "sensitive": False}],
    )
    return w


@pytest.fixture
def api(demo) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {demo.token}")
    return client


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
    created = response.json()
    # Validation is what is under test here: stop the job before it needs a host.
    api.post(f"{jobs_url(w)}/{created['metadata']['id']}/actions", {"action_type": "terminate"}, format="json")
    return created


# -- the table ---------------------------------------------------------------------------------------------------
def env(n: int, start: int = 0) -> list[dict]:
    return [{"name": f"VAR_{i}", "value": str(i), "sensitive": i % 2 == 0} for i in range(start, start + n)]


def mounts(n: int, fs: str = "fs1") -> list[dict]:
    return [{"file_system": fs, "path": "/", "mount_path": f"/mnt/m{i}", "read_only": i % 2 == 1} for i in range(n)]


def tags(n: int) -> list[dict]:
    return [{"key": f"k{i}", "value": f"v{i}"} for i in range(n)]


ARTIFACTS = {"store_artifacts": True, "artifact_path": "obs://bucket/out/"}
PUBLISH_NEW = {
    **ARTIFACTS,
    "auto_publish": True,
    "publish_as": "new",
    "model_name": "my-model",
    "model_type": "text_generation",
    "model_description": "Fine-tuned for the test.",
}
PRESET = {"image_source": "preset", "preset_image": "busybox"}
DESCRIPTION_OK = "训练 job-1_a, b. 中文，。" + "x" * 236  # 256 characters of every allowed kind
MODEL_NAME_128 = "m" + "x" * 126 + "1"


@dataclass
class Case:
    id: str
    values: dict
    field: str  # the model (and form) field refused
    needle: str  # a word of the message: the limit or the rule

    def param(self):
        return pytest.param(self, id=self.id)


REFUSED = [
    # basic
    Case("name-65", {"name": "n" * 65}, "name", "64"),
    Case("name-chars", {"name": "bad name!"}, "name", "letters, digits"),
    Case("name-empty", {"name": ""}, "name", "required"),
    Case("description-257", {"description": "d" * 257}, "description", "256"),
    Case("description-chars", {"description": "no ! or ?"}, "description", "not allowed: '!' '?'"),
    Case("description-newline", {"description": "a\nb"}, "description", "0-256 characters"),
    Case("finetune-without-start", {"training_mode": "finetune"}, "training_mode", "preset template or a model"),
    Case("training-mode-unknown", {"training_mode": "magic"}, "training_mode", "custom or finetune"),
    # training
    Case("preset-image-needs-code-dir", {**PRESET}, "code_dir", "required with a preset image"),
    Case("code-dir-no-slash", {"code_dir": "obs://bucket/code"}, "code_dir", "ending with '/'"),
    Case("code-dir-not-obs", {"code_dir": "s3://bucket/code/"}, "code_dir", "obs://"),
    Case("code-dir-missing", {"code_dir": "obs://bucket/nothing/"}, "code_dir", "does not exist"),
    Case("code-dir-1001-files", {"code_dir": "obs://bucket/files-1001/"}, "code_dir", "at most 1000 files"),
    Case("code-dir-depth-33", {"code_dir": "obs://bucket/depth-33/"}, "code_dir", "at most 32 levels"),
    Case("code-dir-over-5gb", {"code_dir": "obs://bucket/size-over/"}, "code_dir", "at most 5 GB"),
    Case("backup-dir-no-bucket", {"code_backup_dir": "obs://nobucket/b/"}, "code_backup_dir", "does not exist"),
    Case("local-code-dir-home", {"local_code_dir": "/home/ma-user"}, "local_code_dir", "not /home/ma-user"),
    Case("local-code-dir-home-slash", {"local_code_dir": "/home/ma-user/"}, "local_code_dir", "/home/ma-user"),
    Case("local-code-dir-modelarts", {"local_code_dir": "/home/ma-user/modelarts/x"}, "local_code_dir", "under"),
    Case("local-code-dir-modelarts-itself", {"local_code_dir": "/home/ma-user/modelarts"}, "local_code_dir", "under"),
    Case("local-code-dir-dev", {"local_code_dir": "/home/ma-user/modelarts-dev/code"}, "local_code_dir", "under"),
    Case("local-code-dir-infer", {"local_code_dir": "/home/ma-user/infer/code"}, "local_code_dir", "under"),
    Case("local-code-dir-relative", {"local_code_dir": "code/dir"}, "local_code_dir", "absolute path"),
    Case(
        "local-code-dir-dotdot", {"local_code_dir": "/home/ma-user/work/../modelarts/x"}, "local_code_dir", "absolute"
    ),
    Case("env-101", {"environments": env(101)}, "environments", "at most 100"),
    Case("env-bad-name", {"environments": [{"name": "1BAD", "value": "x"}]}, "environments", "not a valid name"),
    Case("env-dash-name", {"environments": [{"name": "MY-VAR", "value": "x"}]}, "environments", "not a valid name"),
    Case("env-twice", {"environments": env(1) + env(1)}, "environments", "set twice"),
    Case("env-platform", {"environments": [{"name": "RANK", "value": "3"}]}, "environments", "set by the platform"),
    Case("env-ma-prefix", {"environments": [{"name": "MA_JOB_DIR", "value": "/x"}]}, "environments", "all MA_* names"),
    # resources
    Case("pool-public-as-dedicated", {**DEDICATED, "pool": "test-pool"}, "pool", "public pool"),
    Case(
        "dedicated-without-pool", {"pool_type": "dedicated", "flavor": "cpu-small"}, "pool", "dedicated resource pool"
    ),
    Case("dedicated-without-flavor", {"pool_type": "dedicated", "pool": "ded"}, "flavor", "Choose a flavor"),
    Case("flavor-larger-than-node", {**DEDICATED, "flavor": "cpu-huge"}, "flavor", "larger than a node"),
    Case("flavor-single-process", {"flavor": "GPU:1*tnt004", "node_count": 2}, "flavor", "single-process"),
    Case(
        "public-kind-mismatch",
        {**PRESET, "preset_image": "busybox-gpu", "code_dir": "obs://bucket/code/", "flavor": "cpu-small"},
        "flavor",
        "same kind",
    ),  # fmt: skip
    Case("public-custom-kind-mismatch", {"image_kind": "cpu", "flavor": "gpu-1"}, "flavor", "all CPU or all GPU"),
    Case(
        "custom-cpus-over-node",
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 8.5, "custom_memory_gb": 8},
        "custom_cpus",
        "between 0.1 and 8",
    ),
    Case(
        "custom-gpus-over-node",
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 2, "custom_memory_gb": 8, "custom_gpus": 3},
        "custom_gpus",
        "between 0 and 2",
    ),
    Case(
        "custom-memory-missing",
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 2},
        "custom_memory_gb",
        "required with a custom spec",
    ),
    Case("node-count-0", {"node_count": 0}, "node_count", "between 1 and 64"),
    Case("node-count-65", {"node_count": 65}, "node_count", "between 1 and 64"),
    Case("mounts-16", {**DEDICATED, "file_system_mounts": mounts(16)}, "file_system_mounts", "at most 15"),
    Case(
        "mount-path-twice",
        {**DEDICATED, "file_system_mounts": mounts(1) + mounts(1, fs="hostfs")},
        "file_system_mounts",
        "used twice",
    ),
    Case(
        "mount-path-twice-across-kinds",
        {
            **DEDICATED,
            "file_system_mounts": mounts(1),
            "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/mnt/m0/"}],
        },
        "obs_mounts",
        "used twice",
    ),
    *[
        Case(
            f"mount-path-{name}",
            {**DEDICATED, "file_system_mounts": [{"file_system": "fs1", "mount_path": path}]},
            "file_system_mounts",
            "not / nor /cache",
        )
        for name, path in [
            ("root", "/"),
            ("cache", "/cache"),
            ("modelarts", "/home/ma-user/modelarts"),
            ("below-modelarts", "/home/ma-user/modelarts/data"),
            ("job-data", "/job-data"),
            ("relative", "data"),
        ]
    ],
    Case(
        "mount-unknown-file-system",
        {**DEDICATED, "file_system_mounts": [{"file_system": "nope", "mount_path": "/mnt/x"}]},
        "file_system_mounts",
        "no file system named 'nope'",
    ),
    Case(
        "mount-bad-options",
        {**DEDICATED, "file_system_mounts": [{"file_system": "fs1", "mount_path": "/mnt/x", "options": "vers=3,;rm"}]},
        "file_system_mounts",
        "NFS options",
    ),
    Case(
        "obs-mounts-2",
        {
            **DEDICATED,
            "obs_mounts": [
                {"obs_url": "obs://bucket/data/", "mount_path": "/mnt/a"},
                {"obs_url": "obs://bucket/out/", "mount_path": "/mnt/b"},
            ],
        },
        "obs_mounts",
        "at most 1",
    ),
    Case(
        "obs-mount-cache",
        {**DEDICATED, "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/cache"}]},
        "obs_mounts",
        "not / nor /cache",
    ),
    Case("priority-0", {**DEDICATED, "priority": 0}, "priority", "1-3"),
    Case("priority-4", {**DEDICATED, "priority": 4}, "priority", "1-3"),
    Case("priority-3-without-permission", {**DEDICATED, "priority": 3}, "priority", "may use high priority"),
    Case(
        "affinity-foreign-host",
        {**DEDICATED, "affinity": "affinity", "affinity_hosts": ["local"]},
        "affinity_hosts",
        "hosts of pool ded",
    ),
    Case("affinity-no-host", {**DEDICATED, "affinity": "anti_affinity"}, "affinity_hosts", "at least one host"),
    # dedicated-only settings on the public pool
    *[
        Case(f"public-{field_}", values, field_, "only available on a dedicated resource pool")
        for field_, values in [
            ("spec_type", {"spec_type": "custom", "custom_cpus": 1, "custom_memory_gb": 1}),
            ("affinity", {"affinity": "affinity", "affinity_hosts": ["ded-1"]}),
            ("file_system_mounts", {"file_system_mounts": mounts(1)}),
            ("obs_mounts", {"obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/mnt/o"}]}),
            ("priority", {"priority": 2}),
            ("preemptible", {"preemptible": True}),
            ("tensorboard", {"tensorboard": True, "observe_file_system": "fs1"}),
            ("mindstudio_insight", {"mindstudio_insight": True, "observe_file_system": "fs1"}),
            ("retention_hours", {"retention_hours": 2}),
        ]
    ],
    # data
    Case("datasets-4", {"datasets": ["preset-1", "preset-2", "preset-3", "mine"]}, "datasets", "at most 3"),
    Case("dataset-offline", {"datasets": ["mine-offline"]}, "datasets", "offline"),
    Case("dataset-not-mine", {"datasets": ["theirs"]}, "datasets", "not yours"),
    # storage
    Case("artifacts-without-path", {"store_artifacts": True}, "artifact_path", "Storage path is required"),
    Case("artifacts-path-no-slash", {**ARTIFACTS, "artifact_path": "obs://bucket/out"}, "artifact_path", "obs://"),
    *[
        Case(f"artifact-mount-{name}", {**ARTIFACTS, "artifact_mount_path": path}, "artifact_mount_path", needle)
        for name, path, needle in [
            ("home", "/home/", "system directories"),
            ("home-no-slash", "/home", "system directories"),
            ("ma-user", "/home/ma-user/", "system directories"),
            ("modelarts", "/home/ma-user/modelarts/", "system directories"),
            ("dot", "/home/ma-user/out.put", "letters, digits, '-', '_' and '/'"),
            ("space", "/home/ma-user/out put", "letters, digits, '-', '_' and '/'"),
            ("cache", "/cache", "not / nor /cache"),
        ]
    ],
    Case("publish-needs-artifacts", {**PUBLISH_NEW, "store_artifacts": False}, "auto_publish", "store artifacts on"),
    Case("model-name-1-char", {**PUBLISH_NEW, "model_name": "m"}, "model_name", "2-128 characters"),
    Case("model-name-1-cjk", {**PUBLISH_NEW, "model_name": "模"}, "model_name", "2-128 characters"),
    Case("model-name-129", {**PUBLISH_NEW, "model_name": MODEL_NAME_128 + "x"}, "model_name", "2-128 characters"),
    Case("model-name-starts-digit", {**PUBLISH_NEW, "model_name": "1model"}, "model_name", "starting with"),
    Case("model-name-starts-dash", {**PUBLISH_NEW, "model_name": "-model"}, "model_name", "starting with"),
    Case("model-name-ends-dash", {**PUBLISH_NEW, "model_name": "model-"}, "model_name", "ending with"),
    Case("model-name-dot", {**PUBLISH_NEW, "model_name": "my.model"}, "model_name", "CJK characters, letters"),
    Case("model-name-taken", {**PUBLISH_NEW, "model_name": "existing-model"}, "model_name", "already have a model"),
    Case("model-name-missing", {**PUBLISH_NEW, "model_name": ""}, "model_name", "required for a new model"),
    Case("model-type-missing", {**PUBLISH_NEW, "model_type": ""}, "model_type", "required for a new model"),
    Case("model-type-unknown", {**PUBLISH_NEW, "model_type": "audio"}, "model_type", "must be one of"),
    Case("model-description-missing", {**PUBLISH_NEW, "model_description": ""}, "model_description", "required"),
    Case(
        "version-of-their-model",
        {**PUBLISH_NEW, "publish_as": "version", "publish_model": "their-model"},
        "publish_model",
        "no model named 'their-model'",
    ),
    Case(
        "version-description-257",
        {**PUBLISH_NEW, "version_description": "v" * 257},
        "version_description",
        "at most 256",
    ),
    # high availability
    Case("max-restarts-129", {"fault_tolerance": True, "max_restarts": 129}, "max_restarts", "between 1 and 128"),
    Case("hang-restart-without-ft", {"hang_restart": True}, "fault_tolerance", "need fault tolerance on"),
    Case("pod-retry-129", {"fault_tolerance": True, "max_restarts": 3, "pod_retry_num": 129}, "pod_retry_num", "128"),
    # access
    Case(
        "ssh-and-mutual-trust",
        {"ssh_remote": True, "ssh_key_pair": "laptop", "mutual_trust": True},
        "mutual_trust",
        "SSH remote development and mutual-trust SSH files exclude each other",
    ),
    Case("ssh-without-key", {"ssh_remote": True}, "ssh_key_pair", "needs a key pair"),
    Case("ssh-their-key", {"ssh_remote": True, "ssh_key_pair": "their-key"}, "ssh_key_pair", "no key pair named"),
    Case("mutual-trust-dir-root", {"mutual_trust": True, "mutual_trust_dir": "/"}, "mutual_trust_dir", "other than /"),
    # observe
    Case(
        "tensorboard-and-mindstudio",
        {**DEDICATED, "tensorboard": True, "mindstudio_insight": True, "observe_file_system": "fs1"},
        "mindstudio_insight",
        "TensorBoard and MindStudio Insight exclude each other",
    ),
    Case("tensorboard-without-fs", {**DEDICATED, "tensorboard": True}, "observe_file_system", "needs a file system"),
    Case(
        "summary-path-modelarts",
        {**DEDICATED, "tensorboard": True, "observe_file_system": "fs1", "observe_path": "/home/ma-user/modelarts/s"},
        "observe_path",
        "not / nor /cache",
    ),
    Case(
        "metrics-port-0",
        {"metrics_mode": "http", "metrics_path": "/metrics", "metrics_port": 0},
        "metrics_port",
        "1-65535",
    ),
    Case(
        "metrics-port-65536",
        {"metrics_mode": "http", "metrics_path": "/metrics", "metrics_port": 65536},
        "metrics_port",
        "1-65535",
    ),
    Case(
        "metrics-path", {"metrics_mode": "http", "metrics_path": "metrics", "metrics_port": 9100}, "metrics_path", "'/'"
    ),
    Case("metrics-command-missing", {"metrics_mode": "command"}, "metrics_command", "command"),
    # more
    Case("keep-logs-without-path", {"keep_logs": True}, "log_export_path", "Log path is required"),
    Case("log-path-no-slash", {"keep_logs": True, "log_export_path": "obs://bucket/logs"}, "log_export_path", "obs://"),
    Case("auto-stop-0", {"auto_stop_hours": 0}, "auto_stop_hours", "1-720 hours"),
    Case("auto-stop-721", {"auto_stop_hours": 721}, "auto_stop_hours", "1-720 hours"),
    Case("retention-0", {**DEDICATED, "retention_hours": 0}, "retention_hours", "1-720 hours"),
    Case("retention-721", {**DEDICATED, "retention_hours": 721}, "retention_hours", "1-720 hours"),
    Case(
        "retention-with-fault-tolerance",
        {**DEDICATED, "retention_hours": 2, "fault_tolerance": True, "max_restarts": 3},
        "retention_hours",
        "incompatible with fault tolerance",
    ),
    Case("tags-21", {"tags": tags(21)}, "tags", "at most 20"),
    Case("tags-same-key", {"tags": tags(1) + tags(1)}, "tags", "unique"),
    Case("tag-key-empty", {"tags": [{"key": "", "value": "v"}]}, "tags", "1-128"),
    Case("visibility-unknown", {"visibility": "everyone"}, "visibility", "not a valid choice"),
]

ACCEPTED = [
    pytest.param({"name": "n" * 64}, id="name-64"),
    pytest.param({"name": "a"}, id="name-1"),
    pytest.param({"description": DESCRIPTION_OK}, id="description-256-all-kinds"),
    pytest.param({"training_mode": "finetune", "preset_template": "qwen-sft"}, id="finetune-template"),
    pytest.param({"training_mode": "finetune", "base_model": "existing-model"}, id="finetune-model"),
    pytest.param({**PRESET, "code_dir": "obs://bucket/code/"}, id="preset-image-code-dir"),
    pytest.param({"code_dir": "obs://bucket/files-1000/"}, id="code-dir-1000-files"),
    pytest.param({"code_dir": "obs://bucket/depth-32/"}, id="code-dir-depth-32"),
    pytest.param({"code_dir": "obs://bucket/size-5g/"}, id="code-dir-5gb"),
    pytest.param({"code_backup_dir": "obs://bucket/backup/"}, id="backup-dir"),
    pytest.param({"local_code_dir": "/home/ma-user/work"}, id="local-code-dir-custom"),
    pytest.param({"local_code_dir": "/home/ma-user/modelarts-data"}, id="local-code-dir-lookalike"),
    pytest.param({"local_code_dir": v.DEFAULT_LOCAL_CODE_DIR}, id="local-code-dir-default"),
    pytest.param({"environments": env(100)}, id="env-100"),
    pytest.param({**DEDICATED, "file_system_mounts": mounts(15)}, id="mounts-15"),
    pytest.param(
        {
            **DEDICATED,
            "file_system_mounts": mounts(1) + [{"file_system": "fs1", "path": "/sub", "mount_path": "/mnt/2"}],
        },
        id="same-fs-twice",
    ),
    pytest.param(
        {**DEDICATED, "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/home/ma-user/data"}]},
        id="obs-mount-1",
    ),
    pytest.param({**DEDICATED, "priority": 1}, id="priority-1"),
    pytest.param({**DEDICATED, "priority": 2, "preemptible": True}, id="priority-2-preemptible"),
    pytest.param({"priority": 1}, id="public-priority-default"),
    pytest.param(
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 8, "custom_memory_gb": 32, "custom_gpus": 2},
        id="custom-spec-node-size",
    ),
    pytest.param(
        {**DEDICATED, "affinity": "anti_affinity", "affinity_strength": "preferred", "affinity_hosts": ["ded-1"]},
        id="affinity",
    ),
    pytest.param({"flavor": "GPU:1*tnt004", "node_count": 1}, id="single-process-1"),
    pytest.param({"image_kind": "gpu", "flavor": "gpu-1"}, id="public-kinds-match"),
    pytest.param({**DEDICATED, "image_kind": "cpu", "flavor": "gpu-1", "pool": "ded"}, id="dedicated-kinds-free"),
    pytest.param({"datasets": ["preset-1", "preset-2", "mine"]}, id="datasets-3"),
    pytest.param({**ARTIFACTS, "artifact_mount_path": "/home/ma-user/outputs"}, id="artifacts"),
    pytest.param({**ARTIFACTS, "artifact_mount_path": "/data/out-1_a"}, id="artifact-mount-chars"),
    pytest.param({**PUBLISH_NEW, "model_name": "ab"}, id="model-name-2"),
    pytest.param({**PUBLISH_NEW, "model_name": MODEL_NAME_128}, id="model-name-128"),
    pytest.param({**PUBLISH_NEW, "model_name": "模型-v_1"}, id="model-name-cjk"),
    pytest.param({**PUBLISH_NEW, "version_description": "v" * 256}, id="version-description-256"),
    pytest.param(
        {**ARTIFACTS, "auto_publish": True, "publish_as": "version", "publish_model": "existing-model"},
        id="publish-version",
    ),
    pytest.param({"fault_tolerance": True, "max_restarts": 1}, id="max-restarts-1"),
    pytest.param({"fault_tolerance": True, "max_restarts": 128, "pod_retry_num": 128}, id="max-restarts-128"),
    pytest.param({"operator_reexecution": True}, id="operator-reexecution"),
    pytest.param({"ssh_remote": True, "ssh_key_pair": "laptop", "jupyter_lab": True}, id="ssh"),
    pytest.param({"mutual_trust": True}, id="mutual-trust-default-dir"),
    pytest.param({**DEDICATED, "tensorboard": True, "observe_file_system": "fs1"}, id="tensorboard"),
    pytest.param({**DEDICATED, "mindstudio_insight": True, "observe_file_system": "hostfs"}, id="mindstudio"),
    pytest.param({"metrics_mode": "http", "metrics_path": "/metrics", "metrics_port": 1}, id="metrics-port-1"),
    pytest.param({"metrics_mode": "http", "metrics_path": "/m", "metrics_port": 65535}, id="metrics-port-65535"),
    pytest.param(
        {"metrics_mode": "command", "metrics_command": "cat", "metrics_args": "/tmp/a.prom"}, id="metrics-cmd"
    ),
    pytest.param({"keep_logs": True, "log_export_path": "obs://bucket/logs/"}, id="keep-logs"),
    pytest.param({"auto_stop_hours": 1}, id="auto-stop-1"),
    pytest.param({"auto_stop_hours": 720}, id="auto-stop-720"),
    pytest.param({**DEDICATED, "retention_hours": 1}, id="retention-1"),
    pytest.param({**DEDICATED, "retention_hours": 720}, id="retention-720"),
    pytest.param({"tags": tags(20)}, id="tags-20"),
    pytest.param({"visibility": "creator", "log_time_range_download": True}, id="visibility-and-log-range"),
]


@pytest.mark.parametrize("case", [c.param() for c in REFUSED])
def test_form_and_api_refuse_alike(world, api, case: Case):
    values = {**BASE, **case.values}
    form_errors, api_errors = both_refuse(world, api, values)
    assert case.field in form_errors, form_errors
    message = form_errors[case.field]
    assert case.needle.lower() in " ".join(message).lower(), message
    path = FIELD_PATHS[case.field]
    assert api_errors.get(path) == message, (path, api_errors)
    # Nothing else differs either: the same fields are refused on both paths.
    assert {FIELD_PATHS.get(f, f) for f in form_errors} == set(api_errors), (form_errors, api_errors)


@pytest.mark.parametrize("values", ACCEPTED)
def test_form_and_api_accept_the_edge(world, api, worker, values):
    both_accept(world, api, {**BASE, **values})


# -- priority 3 needs the permission -------------------------------------------------------------------------
def test_priority_3_with_the_permission_is_accepted_on_both_paths(world, api, worker):
    owner = world.owner
    owner.user_permissions.add(Permission.objects.get(codename="use_high_priority"))
    world.demo.owner = type(owner).objects.get(pk=owner.pk)  # a fresh user: no cached permissions
    created = both_accept(world, api, {**BASE, **DEDICATED, "priority": 3})
    assert created["spec"]["schedule_policy"] == {"priority": 3, "preemptible": False}


# -- env var import from a file -----------------------------------------------------------------------------
def test_parse_env_file_reads_key_value_lines():
    text = "# comment\nexport A=1\nB = two words\n\nC='quoted'\nD=\"x=y\"\n"
    assert v.parse_env_file(text) == [
        {"name": "A", "value": "1", "sensitive": False},
        {"name": "B", "value": "two words", "sensitive": False},
        {"name": "C", "value": "quoted", "sensitive": False},
        {"name": "D", "value": "x=y", "sensitive": False},
    ]


@pytest.mark.parametrize(
    "text, existing, needle",
    [
        pytest.param("".join(f"V{i}=x\n" for i in range(101)), 0, "at most 100", id="101-lines"),
        pytest.param("".join(f"V{i}=x\n" for i in range(51)), 50, "already has 50", id="50-plus-51"),
        pytest.param("A=1\nnot a line\n", 0, "line 2", id="bad-line"),
        pytest.param("A=1\nA=2\n", 0, "repeated", id="repeated"),
        pytest.param("1A=1\n", 0, "not a valid name", id="bad-name"),
    ],
)
def test_parse_env_file_refuses_the_whole_file(text, existing, needle):
    with pytest.raises(Exception) as info:
        v.parse_env_file(text, existing=existing)
    assert needle in " ".join(info.value.messages)
    assert "Nothing was imported" in " ".join(info.value.messages) or "nothing was imported" in " ".join(
        info.value.messages
    )


def test_form_env_file_import_fails_whole_beyond_100_and_fills_up_to_100(world):
    values = {**BASE, "environments": env(50)}
    over = SimpleUploadedFile("env.txt", "".join(f"IMPORTED_{i}=x\n" for i in range(51)).encode())
    form = form_for(world, values, files={"env_file": over})
    assert not form.is_valid()
    assert "at most 100 env vars in total" in " ".join(form.errors["env_file"])
    assert "environments" not in form.errors
    assert form.cleaned_data.get("environments", env(50)) == env(50)  # nothing was added

    exact = SimpleUploadedFile("env.txt", "".join(f"IMPORTED_{i}=x\n" for i in range(50)).encode())
    form = form_for(world, values, files={"env_file": exact})
    assert form.is_valid(), form.errors
    assert len(form.instance.environments) == 100
    assert form.instance.environments[-1] == {"name": "IMPORTED_49", "value": "x", "sensitive": False}


# -- what the API shows and the shapes it accepts -----------------------------------------------------------------
def test_get_returns_the_post_shape_with_sensitive_values_masked(world, api, worker):
    values = {
        **BASE,
        **DEDICATED,
        **PUBLISH_NEW,
        "description": "round trip",
        "environments": [
            {"name": "PLAIN", "value": "visible", "sensitive": False},
            {"name": "TOKEN", "value": "s3cret", "sensitive": True},
        ],
        "code_dir": "obs://bucket/code/",
        "local_code_dir": "/home/ma-user/work",
        "datasets": ["preset-1", "mine"],
        "file_system_mounts": [{"file_system": "fs1", "path": "/", "mount_path": "/mnt/fs", "read_only": True}],
        "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/mnt/obs"}],
        "priority": 2,
        "preemptible": True,
        "keep_logs": True,
        "log_export_path": "obs://bucket/logs/",
        "auto_stop_hours": 6,
        "tags": tags(2),
        "ssh_remote": True,
        "ssh_key_pair": "laptop",
        "tensorboard": True,
        "observe_file_system": "fs1",
        "metrics_mode": "http",
        "metrics_path": "/metrics",
        "metrics_port": 9100,
        "operator_reexecution": True,
    }
    created = both_accept(world, api, values)
    job = api.get(f"{jobs_url(world)}/{created['metadata']['id']}").json()
    algorithm, spec = job["algorithm"], job["spec"]
    assert algorithm["environments"] == [
        {"name": "PLAIN", "value": "visible", "sensitive": False},
        {"name": "TOKEN", "value": "******", "sensitive": True},
    ]
    assert "s3cret" not in str(job)
    stored = TrainingJob.objects.get(id=job["metadata"]["id"])
    assert stored.environment_dict()["TOKEN"] == "s3cret"  # the container still gets it
    assert algorithm["code_dir"] == "obs://bucket/code/" and algorithm["local_code_dir"] == "/home/ma-user/work"
    assert algorithm["inputs"] == [
        {"name": f"data_{i}", "remote": {"dataset": {"id": world.datasets[d]}}}
        for i, d in enumerate(["preset-1", "mine"])
    ]
    assert algorithm["outputs"] == [
        {
            "name": "artifacts",
            "remote": {"obs": {"obs_url": "obs://bucket/out/"}},
            "local_dir": v.DEFAULT_ARTIFACT_MOUNT_PATH,
        }
    ]
    assert spec["resource"] == {"pool_type": "dedicated", "pool_id": "ded", "flavor_id": "cpu-small", "node_count": 1}
    assert spec["volumes"] == [
        {
            "file_system": {
                "name": "fs1",
                "path": "/",
                "local_path": "/mnt/fs",
                "read_only": True,
                "mount_options": v.DEFAULT_NFS_OPTIONS,
            }
        },
        {"obs": {"obs_url": "obs://bucket/data/", "local_path": "/mnt/obs"}},
    ]
    assert spec["schedule_policy"] == {"priority": 2, "preemptible": True}
    assert spec["log_export_path"] == {"obs_url": "obs://bucket/logs/"} and spec["keep_logs"] is True
    assert spec["auto_stop_hours"] == 6
    assert spec["publish"]["version"] == "V1" and spec["publish"]["model_name"] == "my-model"
    assert spec["access"]["key_pair"] == "laptop" and spec["access"]["ssh"] is True
    assert spec["observe"]["prometheus"] == {"type": "http", "path": "/metrics", "port": 9100}
    assert job["metadata"]["tags"] == tags(2)
    assert job["metadata"]["annotations"] == {OPERATOR: "true"}

    # The GET body is a valid POST body (masked values are taken as they are).
    again = copy.deepcopy({k: job[k] for k in ("kind", "metadata", "algorithm", "spec")})
    again["metadata"] = {k: again["metadata"][k] for k in ("name", "description", "visibility", "tags", "annotations")}
    again["metadata"]["name"] = "copy"
    response = api.post(jobs_url(world), again, format="json")
    assert response.status_code == 201, response.json()
    api.post(
        f"{jobs_url(world)}/{response.json()['metadata']['id']}/actions", {"action_type": "terminate"}, format="json"
    )


def test_environments_as_a_map_and_the_template_fills_what_the_body_leaves_empty(world, api, worker):
    body = to_body(world, {**BASE, "preset_template": "qwen-sft", "command": ""})
    body["algorithm"]["engine"] = {}
    body["algorithm"]["environments"] = {"EXTRA": 1}
    created = both_accept_body(world, api, body)
    algorithm = created["algorithm"]
    assert algorithm["template"] == "qwen-sft"
    assert algorithm["engine"]["engine_name"] == "busybox"
    assert algorithm["command"] == "echo template"
    assert algorithm["code_dir"] == "obs://bucket/code/"
    assert [e["name"] for e in algorithm["environments"]] == ["EXTRA", "MODEL"]
    assert created["metadata"]["description"] == "Qwen fine-tuning"


def both_accept_body(w: World, api: APIClient, body: dict) -> dict:
    response = api.post(jobs_url(w), body, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    api.post(f"{jobs_url(w)}/{created['metadata']['id']}/actions", {"action_type": "terminate"}, format="json")
    return created


def test_form_initial_from_a_template(world):
    template = PresetTemplate.objects.get(name="qwen-sft")
    form = JobCreateForm(user=world.owner, template=template)
    assert form.initial["preset_template"] == "qwen-sft"
    assert form.initial["image_source"] == "preset" and form.initial["preset_image"] == "busybox"
    assert form.initial["command"] == "echo template"
    assert form.initial["environments"] == [{"name": "MODEL", "value": "qwen", "sensitive": False}]
    # The rows widget renders them, plus a blank row to add one.
    html = str(form["environments"])
    assert 'name="environments-0-name" value="MODEL"' in html and 'name="environments-1-name"' in html


def test_npu_flavor_keeps_logs_by_default_on_the_api(world, api, worker):
    body = to_body(world, {**BASE, "flavor": "npu-1"})
    response = api.post(jobs_url(world), body, format="json")
    assert response.status_code == 400
    assert "on by default for NPU flavors" in response.json()["errors"]["spec.log_export_path"][0]
    body["spec"]["keep_logs"] = False
    assert both_accept_body(world, api, body)["spec"]["keep_logs"] is False
    body["spec"].pop("keep_logs")
    body["spec"]["log_export_path"] = {"obs_url": "obs://bucket/logs/"}
    body["metadata"]["name"] = "npu-logs"
    assert both_accept_body(world, api, body)["spec"]["keep_logs"] is True


def test_wrong_json_types_are_refused_at_their_path(world, api):
    body = to_body(world, BASE)
    body["spec"]["schedule_policy"] = {"priority": "high", "preemptible": "maybe"}
    body["spec"]["volumes"] = [{"nfs": {}}]
    body["algorithm"]["environments"] = "A=1"
    response = api.post(jobs_url(world), body, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert set(errors) == {
        "spec.schedule_policy.priority",
        "spec.schedule_policy.preemptible",
        "spec.volumes",
        "algorithm.environments",
    }
    assert TrainingJob.objects.count() == 0


@pytest.mark.parametrize(
    "path, value",
    [
        ("algorithm.environments", [["A", "1"], {"name": ["A"], "value": {}}, {"name": "B", "sensitive": "yes"}]),
        ("metadata.tags", [{"key": ["k"]}, "x", {"key": "k", "value": 5}]),
        ("algorithm.inputs", [{"remote": {"dataset": {"id": "seven"}}}, {"remote": {"obs": {}}}]),
        (
            "spec.volumes",
            [{"file_system": {"name": ["fs1"], "local_path": 5, "mount_options": 7}}, {"obs": {"obs_url": 3}}],
        ),
        ("spec.resource.affinity", {"type": "affinity", "hosts": [1, {"a": 1}]}),
        ("spec.resource.custom_spec", {"cpu": "lots", "memory_gb": [], "gpu": 1.5}),
        ("algorithm.engine", {"image_url": "x", "image_kind": "tpu"}),
    ],
)
def test_odd_shapes_are_refused_with_400_never_500(world, api, path, value):
    body = to_body(world, {**BASE, **DEDICATED})
    node = body
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    response = api.post(jobs_url(world), body, format="json")
    assert response.status_code == 400, response.content
    assert any(key.startswith(path.split(".")[0]) for key in response.json()["errors"]), response.json()
    assert TrainingJob.objects.count() == 0


def test_max_restarts_0_is_refused_in_the_form_and_means_off_in_the_api(world, api, worker):
    form = form_for(world, {**BASE, "fault_tolerance": True, "max_restarts": 0})
    assert not form.is_valid()
    assert "between 1 and 128" in form.errors["max_restarts"][0]
    body = to_body(world, BASE)
    body["metadata"]["annotations"] = {RETRY: "0"}
    assert both_accept_body(world, api, body)["status"]["max_restarts"] == 0


def test_every_field_the_model_refuses_is_on_the_form_and_has_an_api_path():
    form_fields = set(JobCreateForm.base_fields)
    for name in FIELD_PATHS:
        if name != "__all__":
            assert name in form_fields, name
            TrainingJob._meta.get_field(name)


# -- object storage -------------------------------------------------------------------------------------------------
def test_measure_counts_size_files_and_depth(obs_root, settings):
    settings.OBJECT_STORAGE_ROOT = str(obs_root)
    assert storage.measure("obs://bucket/files-1000/") == storage.Usage(0, 1000, 1)
    assert storage.measure("obs://bucket/depth-33/").depth == 33
    assert storage.measure("obs://bucket/size-over/").bytes == 5 * GB + 1
    stopped = storage.measure("obs://bucket/files-1001/", stop_after_files=10)
    assert stopped.files == 11 and not stopped.complete
    assert storage.local_path("obs://bucket/code/") == (obs_root / "bucket" / "code").resolve()
    for bad in ("obs://bucket/../etc/", "s3://bucket/x/", "obs://UPPER/x/"):
        with pytest.raises(storage.StorageError):
            storage.local_path(bad)


def test_code_browser_lists_reads_and_edits_by_suffix(obs_root, settings, tmp_path):
    settings.OBJECT_STORAGE_ROOT = str(tmp_path)
    (tmp_path / "b01" / "code" / "sub").mkdir(parents=True)
    (tmp_path / "b01" / "code" / "train.py").write_text("print(1)\n")
    (tmp_path / "b01" / "code" / "run.log").write_text("log\n")
    (tmp_path / "b01" / "code" / "model.bin").write_bytes(b"\0")
    entries = storage.listdir("obs://b01/code/")
    assert [(e.name, e.is_dir, e.editable, e.viewable) for e in entries] == [
        ("sub", True, False, False),
        ("model.bin", False, False, False),
        ("run.log", False, False, True),
        ("train.py", False, True, True),
    ]
    storage.write_text("obs://b01/code/train.py", "print(2)\n")
    assert storage.read_text("obs://b01/code/train.py") == "print(2)\n"
    assert storage.read_text("obs://b01/code/run.log") == "log\n"
    with pytest.raises(storage.StorageError):
        storage.write_text("obs://b01/code/run.log", "x")
    with pytest.raises(storage.StorageError):
        storage.read_text("obs://b01/code/model.bin")


def test_runtime_layout_previews_the_directories(world):
    job = TrainingJob(
        workspace=world.demo.workspace,
        created_by=world.owner,
        code_dir="obs://bucket/code/",
        store_artifacts=True,
        artifact_path="obs://bucket/out/",
        datasets=[world.datasets["preset-1"]],
    )
    paths = {row["path"]: row["what"] for row in job.runtime_layout()}
    assert paths[v.DEFAULT_LOCAL_CODE_DIR].startswith("Local code dir")
    assert paths[f"{v.DEFAULT_LOCAL_CODE_DIR}/code"] == "Code folder"
    assert paths[v.DEFAULT_ARTIFACT_MOUNT_PATH] == "Outputs (artifacts)"
    assert any(what.startswith("Dataset preset-1") for what in paths.values())


def test_publish_final_model_numbers_versions(world):
    job = TrainingJob.objects.create(
        workspace=world.demo.workspace,
        created_by=world.owner,
        name="pub",
        image=BUSYBOX,
        command="true",
        **{k: val for k, val in PUBLISH_NEW.items() if k != "publish_as"},
    )
    assert job.publish_version == "V1"
    first = job.publish_final_model()
    assert (first.model.name, first.label) == ("my-model", "V1")
    job.publish_as, job.publish_model = "version", first.model
    assert job.publish_version == "V2"
    assert job.publish_final_model().label == "V2"


def test_template_apply_fills_the_job(world):
    job = TrainingJob(environments=[{"name": "MODEL", "value": "mine", "sensitive": True}], command="keep me")
    PresetTemplate.objects.get(name="qwen-sft").apply_template(job, overwrite=False)
    assert job.command == "keep me" and job.code_dir == "obs://bucket/code/"
    assert job.environments == [{"name": "MODEL", "value": "mine", "sensitive": True}]
    PresetTemplate.objects.get(name="qwen-sft").apply_template(job)
    assert job.command == "echo template" and job.environments[0]["value"] == "qwen"


def test_form_accepts_json_lists_too(world):
    data = to_form(world, BASE)
    data["environments"] = '[{"name": "A", "value": "1", "sensitive": true}]'
    data["tags"] = "not json"
    form = JobCreateForm(data, user=world.owner)
    form.instance.created_by = world.owner
    assert not form.is_valid()
    assert list(form.errors) == ["tags"]
    assert form.cleaned_data["environments"] == [{"name": "A", "value": "1", "sensitive": True}]


# -- the admin ------------------------------------------------------------------------------------------------------
def test_admin_lists_the_catalogues_and_masks_sensitive_env_vars(world, client):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", password="root-password")
    client.force_login(admin)
    job = TrainingJob.objects.create(
        workspace=world.demo.workspace,
        created_by=world.owner,
        name="admin-view",
        image=BUSYBOX,
        command="true",
        environments=[{"name": "TOKEN", "value": "s3cret", "sensitive": True}],
    )
    for model in ("presettemplate", "filesystem", "dataset", "model", "modelversion", "keypair", "presetimage"):
        for query in ("", "?q=a", "?o=1"):
            assert client.get(f"/admin/jobs/{model}/{query}").status_code == 200, model
    assert client.get("/admin/jobs/dataset/?online__exact=1&owner__isempty=1").status_code == 200
    assert client.get("/admin/jobs/presettemplate/?type__exact=text_generation").status_code == 200
    page = client.get(f"/admin/jobs/trainingjob/{job.id}/change/")
    assert page.status_code == 200
    assert b"s3cret" not in page.content and b"TOKEN=******" in page.content
