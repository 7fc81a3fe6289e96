"""File systems belong to the workspaces an operator grants them to (docs/decisions.md
"Workspaces own their storage"), as buckets do.

- Validation, one path for the form and the API: a file system mount or TensorBoard summaries on a
  file system not granted to the job's workspace are refused naming the field; a grant opens it.
- The wizard offers only the file systems of the user's workspaces.
- The runtime asks again: a grant revoked after submission refuses the start, and nothing is made
  on the file system (a hostile workspace cannot have the console create folders in another's).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs.api.serializers import FIELD_PATHS
from jobs.forms import JobCreateForm
from jobs.models import FileSystem, Flavor, ResourcePool, TrainingJob, Workspace
from jobs.runtime.staging import StagingError, prepare_sources
from tests.folders import snapshot
from tests.helpers import BUSYBOX, api_client, instance_of
from tests.spec_io import BASE, World, form_for, to_body

pytestmark = pytest.mark.django_db

DEDICATED = {"pool_type": "dedicated", "pool": "ded", "flavor": "cpu-small"}


@pytest.fixture
def team_fs(demo, tmp_path) -> tuple[FileSystem, Path]:
    """'team-fs', a host directory granted to the demo workspace 'team' only; a dedicated pool."""
    root = tmp_path / "team-fs"
    (root / "data").mkdir(parents=True)
    (root / "data" / "secret.txt").write_text("team data\n")
    fs = FileSystem.objects.create(name="team-fs", kind=FileSystem.Kind.HOST_DIR, source=str(root))
    fs.workspaces.add(demo.workspace)
    ResourcePool.objects.create(name="ded", kind=ResourcePool.Kind.DEDICATED, node_cpus=8, node_memory_gb=32)
    Flavor.objects.create(name="cpu-small", cpus=1, memory_mb=2048)
    return fs, root


def elsewhere() -> Workspace:
    return Workspace.objects.get(name="elsewhere")


FIELDS = {
    "file_system_mounts": (
        {**DEDICATED, "file_system_mounts": [{"file_system": "team-fs", "path": "/data", "mount_path": "/mnt/fs"}]},
        "File system mount 1",
    ),
    "observe_file_system": (
        {**DEDICATED, "tensorboard": True, "observe_file_system": "team-fs", "observe_path": "/home/ma-user/summary"},
        "TensorBoard summaries",
    ),
}


def outsider_creates(demo, values: dict):
    w = World(SimpleNamespace(workspace=elsewhere(), owner=demo.outsider))
    form = form_for(w, {**BASE, **values})
    response = api_client(demo.outsider_token).post(
        f"/v2/{elsewhere().project_id}/training-jobs", to_body(w, {**BASE, **values}), format="json"
    )
    return form, response


@pytest.mark.parametrize("field", list(FIELDS))
def test_another_workspaces_file_system_is_refused_on_both_paths(demo, team_fs, field):
    values, label = FIELDS[field]
    _, root = team_fs
    before = (TrainingJob.objects.count(), snapshot(root))
    form, response = outsider_creates(demo, values)
    message = f"{label}: file system 'team-fs' is not granted to workspace 'elsewhere'."
    assert not form.is_valid() and form.errors[field] == [message], form.errors
    assert response.status_code == 400 and response.json()["errors"][FIELD_PATHS[field]] == [message]
    assert (TrainingJob.objects.count(), snapshot(root)) == before


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_grant_opens_the_file_system(demo, team_fs, field):
    team_fs[0].workspaces.add(elsewhere())
    values, _ = FIELDS[field]
    form, response = outsider_creates(demo, values)
    assert form.is_valid(), form.errors
    assert response.status_code == 201, response.json()


def test_the_wizard_offers_only_the_file_systems_of_the_users_workspaces(demo, team_fs):
    FileSystem.objects.create(name="nobodys", kind=FileSystem.Kind.NFS, source="nfs.example:/x")
    offered = lambda user: [name for name, _ in JobCreateForm(user=user).fields["observe_file_system"].widget.choices]  # noqa: E731
    assert offered(demo.owner) == ["", "team-fs"]
    assert offered(demo.outsider) == [""]
    team_fs[0].workspaces.add(elsewhere())
    assert offered(demo.outsider) == ["", "team-fs"]


def test_the_file_system_admin_shows_and_sets_the_grants(client, demo, team_fs, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    page = client.get("/admin/jobs/filesystem/").content.decode()
    assert "team-fs" in page and "team" in page
    fs, _ = team_fs
    response = client.post(
        f"/admin/jobs/filesystem/{fs.pk}/change/",
        {"name": fs.name, "kind": fs.kind, "source": fs.source, "description": "", "workspaces": [elsewhere().pk]},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert list(fs.workspaces.values_list("name", flat=True)) == ["elsewhere"]


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_grant_revoked_after_submission_refuses_the_start_and_makes_nothing(demo, team_fs, field):
    fs, root = team_fs
    extra = {
        "file_system_mounts": {
            "file_system_mounts": [
                {"file_system": "team-fs", "path": "/new-folder", "mount_path": "/mnt/fs", "read_only": False}
            ]
        },
        "observe_file_system": {"tensorboard": True, "observe_file_system": fs, "observe_path": "/summary"},
    }[field]
    job = TrainingJob(
        workspace=demo.workspace,
        created_by=demo.owner,
        name="granted",
        image=BUSYBOX,
        command="true",
        pool_type="dedicated",
        pool=ResourcePool.objects.get(name="ded"),
        flavor=Flavor.objects.get(name="cpu-small"),
        **extra,
    )
    job.full_clean()
    job.save()
    attempt, task_run = instance_of(job, demo)
    fs.workspaces.remove(demo.workspace)
    before = snapshot(root)
    label = "File system mount" if field == "file_system_mounts" else "TensorBoard summaries (MA_SUMMARY_DIR)"
    with pytest.raises(
        StagingError, match=re.escape(f"{label}: file system 'team-fs' is not granted to workspace 'team'.")
    ):
        prepare_sources(job, attempt, task_run)
    assert snapshot(root) == before  # no folder made on a file system the workspace lost
