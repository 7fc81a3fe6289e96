"""SPEC §3, every row: one table of values drives BOTH the wizard's form and the API.

For each case the same values become the form's POST data and the ModelArts v2 body;
both must refuse with the same message (form field error == API errors[path]), create
nothing, and both must accept the edge just inside the limit. The code dir limits are
checked against real folders in a local object storage root (sparse files for 5 GB).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
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
from tests.helpers import BUSYBOX, api_client
from tests.spec_cases import ACCEPTED, PUBLISH_NEW, REFUSED, Case, env, tags
from tests.spec_io import (
    BASE,
    DEDICATED,
    GB,
    KEY,
    OPERATOR,
    RETRY,
    World,
    both_accept,
    both_refuse,
    form_for,
    jobs_url,
    to_body,
    to_form,
)

# Not transactional, even where a job is created: validation is under test, and a created job's
# start is dispatched on commit, which a rolled-back test never reaches (`no_worker` fails a test
# that queues a task). Without the worker and the flush after each test, the file takes 12 s, not 27.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_worker")]


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
    for name, kind, source in [("fs1", "nfs", "10.0.0.1:/export"), ("hostfs", "host_dir", "/srv/shared")]:
        FileSystem.objects.create(name=name, kind=kind, source=source).workspaces.add(demo.workspace)
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
    return api_client(demo.token)


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
def test_form_and_api_accept_the_edge(world, api, values):
    both_accept(world, api, {**BASE, **values})


# -- priority 3 needs the permission -------------------------------------------------------------------------
def test_priority_3_with_the_permission_is_accepted_on_both_paths(world, api):
    owner = world.owner
    owner.user_permissions.add(Permission.objects.get(codename="use_high_priority"))
    world.demo.owner = type(owner).objects.get(pk=owner.pk)  # a fresh user: no cached permissions
    created = both_accept(world, api, {**BASE, **DEDICATED, "priority": 3})
    assert created["spec"]["schedule_policy"] == {"priority": 3, "preemptible": False}


# -- env var import from a file -----------------------------------------------------------------------------
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
def test_get_returns_the_post_shape_with_sensitive_values_masked(world, api):
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


def test_environments_as_a_map_and_the_template_fills_what_the_body_leaves_empty(world, api):
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
    return response.json()


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


def test_npu_flavor_keeps_logs_by_default_on_the_api(world, api):
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


def test_max_restarts_0_is_refused_in_the_form_and_in_the_api(world, api):
    """Seed 000: the annotation is "1".."128" when present (absent: off); "0" is refused with the
    wizard's message, at the annotation's path, and creates nothing."""
    form = form_for(world, {**BASE, "fault_tolerance": True, "max_restarts": 0})
    assert not form.is_valid()
    message = form.errors["max_restarts"][0]
    assert "between 1 and 128" in message
    body = to_body(world, BASE)
    body["metadata"]["annotations"] = {RETRY: "0"}
    before = TrainingJob.objects.count()
    response = api.post(jobs_url(world), body, format="json")
    assert response.status_code == 400, response.json()
    assert message in response.json()["error_msg"] and f"metadata.annotations.{RETRY}" in response.json()["error_msg"]
    assert TrainingJob.objects.count() == before


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


def test_runtime_layout_previews_the_directories(world):
    job = TrainingJob(
        workspace=world.demo.workspace,
        created_by=world.owner,
        code_dir="obs://bucket/code/",
        store_artifacts=True,
        artifact_path="obs://bucket/out/",
        datasets=[world.datasets["preset-1"]],
    )
    paths = {entry.container_path: entry.what for entry in job.runtime_layout()}
    assert paths[v.DEFAULT_LOCAL_CODE_DIR].startswith("Local code dir")
    assert paths[f"{v.DEFAULT_LOCAL_CODE_DIR}/code"].startswith("Code folder")
    assert paths[v.DEFAULT_ARTIFACT_MOUNT_PATH] == "Artifacts"
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
