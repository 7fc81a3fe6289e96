"""Workspaces own their storage (docs/decisions.md): a bucket is reached only through the
workspace that owns it or one an operator granted it to.

- The browser and the picker: the owner/member/auditor/outsider/superuser matrix over every
  storage route (bucket list, folder, file, save, the picker's listing); a refusal is a 404 that
  changes nothing on disk.
- Job validation, one path for the form and the API: every obs:// field of another workspace's
  bucket (or of a bucket nobody registered) is refused naming the field; a granted workspace is
  accepted.
- The runtime asks again: a grant revoked after submission refuses the start (StagingError) and
  the log export (a failed export saying why), and publishes nothing.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission
from django.utils.html import escape

from jobs import storage
from jobs.api.serializers import FIELD_PATHS
from jobs.models import (
    Bucket,
    Dataset,
    EventKind,
    Flavor,
    Phase,
    ResourcePool,
    TrainingJob,
    Workspace,
)
from jobs.runtime import outputs
from jobs.runtime.staging import StagingError, mounts_for, prepare_sources
from tests.folders import snapshot  # also records owners and link targets: a refusal changes none of those
from tests.helpers import BUSYBOX, api_client, instance_of
from tests.spec_io import BASE, DEDICATED, World, form_for, to_body

pytestmark = pytest.mark.django_db

BROWSE, SAVE = "/storage/", "/storage/save/"
TRAIN_PY = "print('team code')\n"
NOT_YOURS = "Bucket &#x27;bucket&#x27; is not one of your workspaces&#x27;"


def browse(path: str = "", **params: str) -> str:
    query = ({"path": path} if path else {}) | params
    return BROWSE + ("?" + urlencode(query) if query else "")


@pytest.fixture
def obs(demo, settings, tmp_path) -> Path:
    """'bucket' (the team's, registered by the demo fixture), 'else-b' (the other workspace's) and
    'stray-b' (a folder nobody registered), each with a code folder; a dedicated pool for mounts."""
    root = tmp_path / "obs"
    for name in ("bucket", "else-b", "stray-b"):
        for folder in ("code", "data", "out", "logs", "backup"):
            (root / name / folder).mkdir(parents=True)
        (root / name / "code" / "train.py").write_text(TRAIN_PY)
    settings.OBJECT_STORAGE_ROOT = str(root)
    settings.JOB_DATA_ROOT = str(tmp_path / "job-data")
    Bucket.objects.create(name="else-b", workspace=elsewhere())
    pool = ResourcePool.objects.create(name="ded", kind=ResourcePool.Kind.DEDICATED, node_cpus=8, node_memory_gb=32)
    Flavor.objects.create(name="cpu-small", cpus=1, memory_mb=2048)
    assert pool.kind == "dedicated"
    return root


def elsewhere() -> Workspace:
    return Workspace.objects.get(name="elsewhere")


def grant_to_elsewhere(name: str = "bucket") -> None:
    Bucket.objects.get(name=name).granted_to.add(elsewhere())


# -- the browser and the picker ---------------------------------------------------------------------------------------
@pytest.fixture
def users(demo, django_user_model) -> dict:
    auditor = django_user_model.objects.create_user("auditor", password="pw")
    demo.workspace.members.add(auditor)
    auditor.user_permissions.add(Permission.objects.get(codename="list_all_jobs"))
    superuser = django_user_model.objects.create_superuser("root", password="pw")
    return {
        "owner": demo.owner,
        "member": demo.member,
        "auditor": auditor,
        "outsider": demo.outsider,
        "superuser": superuser,
    }


REACHES_BUCKET = {"owner": True, "member": True, "auditor": True, "outsider": False, "superuser": True}


@pytest.mark.parametrize("role", list(REACHES_BUCKET))
def test_storage_routes_follow_the_workspace(client, obs, users, role):
    client.force_login(users[role])
    allowed = REACHES_BUCKET[role]
    before = snapshot(obs)

    listed = client.get(browse()).content.decode()
    assert ('data-name="bucket"' in listed) is allowed
    assert 'data-name="stray-b"' not in listed  # a folder nobody registered: nobody's, not even the superuser's
    assert ('data-name="else-b"' in listed) is (role in ("outsider", "superuser"))
    picker = client.get(browse(pick="code_dir")).content.decode()
    assert ('data-storage-use="obs://bucket/"' in picker) is allowed

    for path in ("obs://bucket/", "obs://bucket/code/", "obs://bucket/code/train.py"):
        response = client.get(browse(path))
        body = response.content.decode()
        if allowed:
            assert response.status_code == 200, (path, body)
        else:
            assert response.status_code == 404, path
            assert NOT_YOURS in body and "train.py" not in body, path
        partial = client.get(browse(path), HTTP_HX_REQUEST="true")
        assert partial.status_code == (200 if allowed else 404) and partial["X-Storage-Browser"] == "1"

    # The picker: a foreign folder the field held starts from the user's own buckets, saying why.
    response = client.get(browse("obs://bucket/code/", pick="code_dir"))
    body = response.content.decode()
    assert response.status_code == 200
    if allowed:
        assert 'data-storage-use="obs://bucket/code/"' in body
    else:
        assert NOT_YOURS in body and "obs://bucket/code/" not in body.replace(NOT_YOURS, "")
        assert 'data-storage-use="obs://else-b/"' in body

    saved = client.post(SAVE, {"path": "obs://bucket/code/train.py", "text": "pwned\n", "overwrite": "1"})
    created = client.post(SAVE, {"path": "obs://bucket/code/new.py", "text": "x\n", "overwrite": "1"})
    htmx = client.post(
        SAVE, {"path": "obs://bucket/code/hx.py", "text": "x\n", "overwrite": "1"}, HTTP_HX_REQUEST="true"
    )
    if allowed:
        assert (saved.status_code, created.status_code, htmx.status_code) == (200, 200, 200)
        assert (obs / "bucket/code/train.py").read_text() == "pwned\n"
    else:
        for response in (saved, created, htmx):
            assert response.status_code == 404 and NOT_YOURS in response.content.decode()
        assert "Not saved: " + NOT_YOURS in htmx.content.decode()  # the editor's status line
        assert snapshot(obs) == before  # nothing read into the page, nothing written


@pytest.mark.parametrize("role", ["owner", "outsider", "superuser"])
def test_an_unregistered_bucket_is_nobodys(client, obs, users, role):
    client.force_login(users[role])
    before = snapshot(obs)
    for path in ("obs://stray-b/", "obs://stray-b/code/train.py", "obs://never-made/"):
        response = client.get(browse(path))
        assert response.status_code == 404 and "is not one of your workspaces" in response.content.decode()
    response = client.post(SAVE, {"path": "obs://stray-b/code/train.py", "text": "x", "overwrite": "1"})
    assert response.status_code == 404
    assert snapshot(obs) == before


def test_a_grant_opens_the_bucket_and_its_revocation_closes_it(client, obs, users):
    client.force_login(users["outsider"])
    assert client.get(browse("obs://bucket/code/train.py")).status_code == 404
    grant_to_elsewhere()
    response = client.get(browse("obs://bucket/code/train.py"))
    assert response.status_code == 200 and escape(TRAIN_PY.strip()) in response.content.decode()
    Bucket.objects.get(name="bucket").granted_to.clear()
    assert client.get(browse("obs://bucket/code/")).status_code == 404


# -- job validation: the form and the API ------------------------------------------------------------------------------
FIELDS = {
    # field: (values pointing at obs://bucket/, label of the message)
    "code_dir": ({"code_dir": "obs://bucket/code/"}, "Code dir"),
    "code_backup_dir": ({"code_backup_dir": "obs://bucket/backup/"}, "Code backup dir"),
    "artifact_path": (
        {"store_artifacts": True, "artifact_path": "obs://bucket/out/", "artifact_mount_path": "/home/ma-user/out"},
        "Artifact storage path",
    ),
    "log_export_path": ({"keep_logs": True, "log_export_path": "obs://bucket/logs/"}, "Log path"),
    "obs_mounts": (
        {**DEDICATED, "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/mnt/obs"}]},
        "Object storage mount",
    ),
    "datasets": ({"datasets": ["team-data"]}, "Dataset team-data"),
}


def world_of(demo, workspace: Workspace, user) -> World:
    w = World(SimpleNamespace(workspace=workspace, owner=user))
    w.datasets["team-data"] = Dataset.objects.get_or_create(name="team-data", owner=None, path="obs://bucket/data/")[
        0
    ].id
    return w


def create_both(w: World, token: str, values: dict):
    """The form (valid or its errors) and the API's answer for the same values."""
    form = form_for(w, values)
    response = api_client(token).post(
        f"/v2/{w.demo.workspace.project_id}/training-jobs", to_body(w, values), format="json"
    )
    return form, response


@pytest.mark.parametrize("field", list(FIELDS))
def test_another_workspaces_bucket_is_refused_on_both_paths(demo, obs, field):
    values, label = FIELDS[field]
    w = world_of(demo, elsewhere(), demo.outsider)
    before = (TrainingJob.objects.count(), snapshot(obs))
    form, response = create_both(w, demo.outsider_token, {**BASE, **values})
    message = f"{label}: bucket 'bucket' is not owned by or granted to workspace 'elsewhere'."
    assert not form.is_valid() and form.errors[field] == [message], form.errors
    assert response.status_code == 400 and response.json()["errors"][FIELD_PATHS[field]] == [message]
    assert (TrainingJob.objects.count(), snapshot(obs)) == before


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_granted_workspace_may_use_the_bucket(demo, obs, field):
    grant_to_elsewhere()
    values, _ = FIELDS[field]
    w = world_of(demo, elsewhere(), demo.outsider)
    form, response = create_both(w, demo.outsider_token, {**BASE, **values})
    assert form.is_valid(), form.errors
    assert response.status_code == 201, response.json()
    assert TrainingJob.objects.get(id=response.json()["metadata"]["id"]).workspace == elsewhere()


@pytest.mark.parametrize("field", list(FIELDS))
def test_the_owner_workspace_may_use_its_bucket_and_not_an_unregistered_one(demo, obs, field):
    values, label = FIELDS[field]
    w = world_of(demo, demo.workspace, demo.owner)
    form, response = create_both(w, demo.token, {**BASE, **values})
    assert form.is_valid(), form.errors
    assert response.status_code == 201, response.json()

    stray = {k: v.replace("obs://bucket/", "obs://stray-b/") if isinstance(v, str) else v for k, v in values.items()}
    if field == "obs_mounts":
        stray["obs_mounts"] = [{"obs_url": "obs://stray-b/data/", "mount_path": "/mnt/obs"}]
    if field == "datasets":
        Dataset.objects.filter(name="team-data").update(path="obs://stray-b/data/")
    form, response = create_both(w, demo.token, {**BASE, **stray, "name": "stray-job"})
    message = f"{label}: bucket 'stray-b' is not owned by or granted to workspace 'team'."
    assert form.errors[field] == [message]
    assert response.status_code == 400 and response.json()["errors"][FIELD_PATHS[field]] == [message]


# -- the runtime asks again -------------------------------------------------------------------------------------------
def granted_job(demo, **fields) -> TrainingJob:
    """A team job using the other workspace's 'else-b', granted to the team when it was submitted."""
    Bucket.objects.get(name="else-b").granted_to.add(demo.workspace)
    job = TrainingJob(
        **(
            dict(workspace=demo.workspace, created_by=demo.owner, name="granted", image=BUSYBOX, command="true")
            | fields
        )
    )
    job.full_clean()
    job.save()
    return job


def revoke(demo) -> None:
    Bucket.objects.get(name="else-b").granted_to.remove(demo.workspace)


@pytest.mark.parametrize(
    "fields, what",
    [
        ({"code_dir": "obs://else-b/code/"}, "Code dir"),
        ({"code_dir": "obs://bucket/code/", "code_backup_dir": "obs://else-b/backup/"}, "Code backup dir"),
        (
            {"store_artifacts": True, "artifact_path": "obs://else-b/out/run/", "artifact_mount_path": "/out"},
            "Artifacts",
        ),
        (
            {
                "pool_type": "dedicated",
                "pool_id": None,
                "obs_mounts": [{"obs_url": "obs://else-b/data/", "mount_path": "/mnt/obs"}],
            },
            "Object storage mount",
        ),
    ],
    ids=["code-dir", "backup-dir", "artifacts", "obs-mount"],
)
def test_a_grant_revoked_after_submission_refuses_the_start(demo, obs, fields, what):
    if "pool_id" in fields:
        fields = fields | {"pool": ResourcePool.objects.get(name="ded"), "flavor": Flavor.objects.get(name="cpu-small")}
        del fields["pool_id"]
    job = granted_job(demo, **fields)
    attempt, task_run = instance_of(job, demo)
    revoke(demo)
    before = snapshot(obs)
    message = f"{what}: bucket 'else-b' is not owned by or granted to workspace 'team'. Refused"
    with pytest.raises(StagingError, match=message):
        prepare_sources(job, attempt, task_run)
    if what not in ("Code dir", "Code backup dir"):  # copied while preparing; the copy is what is mounted
        with pytest.raises(StagingError, match=message):
            mounts_for(job, attempt, task_run)
    assert snapshot(obs) == before  # no copy, no backup, no artifact folder: the job never touched it


def test_a_dataset_in_a_revoked_bucket_refuses_the_start(demo, obs):
    dataset = Dataset.objects.create(name="their-data", owner=None, path="obs://else-b/data/")
    job = granted_job(demo, datasets=[dataset.id])
    attempt, task_run = instance_of(job, demo)
    revoke(demo)
    with pytest.raises(StagingError, match="Dataset their-data: bucket 'else-b' is not owned by or granted"):
        mounts_for(job, attempt, task_run)


def test_a_revoked_grant_fails_the_log_export_and_the_publish(demo, obs):
    job = granted_job(
        demo,
        keep_logs=True,
        log_export_path="obs://else-b/logs/",
        store_artifacts=True,
        artifact_path="obs://else-b/out/",
        artifact_mount_path="/out",
    )
    (obs / "else-b/out/model.bin").write_bytes(b"weights")
    TrainingJob.objects.filter(id=job.id).update(phase=Phase.COMPLETED)
    revoke(demo)
    before = snapshot(obs)
    assert outputs.export_logs(job.id)
    job.refresh_from_db()
    reason = "bucket 'else-b' is not owned by or granted to workspace 'team'."
    assert job.logs_export_error == f"Log export to obs://else-b/logs/ failed: {reason}"
    event = job.events.get(kind=EventKind.LOGS_EXPORT_FAILED)
    assert reason in event.message and "The logs stay in the console." in event.message
    assert outputs.logs_status(job)["state"] == "export_failed"
    job.auto_publish, job.publish_as, job.model_name = True, TrainingJob.PublishAs.NEW, "m"
    assert outputs._why_not_publishable(job) == f"Artifact storage path: {reason}"
    assert snapshot(obs) == before


def test_tenancy_helpers(demo, obs):
    assert storage.bucket_allowed("obs://bucket/x/", demo.workspace)
    assert storage.bucket_allowed("obs://bucket/x/", demo.workspace.pk)
    assert not storage.bucket_allowed("obs://bucket/x/", elsewhere())
    assert not storage.bucket_allowed("obs://stray-b/", demo.workspace)
    assert not storage.bucket_allowed("not a url", demo.workspace)
    assert not storage.bucket_allowed("obs://bucket/", None)
    assert "else-b" not in storage.buckets_of(demo.member) and "bucket" in storage.buckets_of(demo.member)
    assert storage.buckets_of(demo.outsider) == {"else-b"}
    grant_to_elsewhere()
    assert storage.buckets_of(demo.outsider) == {"else-b", "bucket"}
    assert storage.tenancy_error("obs://bucket/", elsewhere(), "Code dir") == ""
