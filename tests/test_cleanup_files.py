"""The console's own per-job folders (code copies, SSH dirs with the job's private key, control
dirs) of jobs no row knows are removed by the orphan scan (jobs/runtime/cleanup.py): a job deleted
while a start still wrote them, or deleted before deletes removed them. Unit: the database and the
real disk, no Docker."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from django.utils import timezone

from jobs.models import TrainingJob
from jobs.runtime import cleanup, control
from jobs.runtime.layout import LOCAL_CODE_STAGING
from jobs.runtime.ssh import SSH_STAGING
from tests.helpers import BUSYBOX

pytestmark = pytest.mark.django_db


def folder(parent: Path, name: str, *, age_s: float) -> Path:
    made = parent / name
    made.mkdir(parents=True, exist_ok=True)
    (made / "id_ed25519").write_text("secret")
    then = time.time() - age_s
    os.utime(made, (then, then))
    return made


def test_folders_of_unknown_jobs_go_those_of_known_jobs_and_links_stay(demo, settings, tmp_path):
    settings.JOB_DATA_ROOT = tmp_path / "job-data"
    settings.CONTROL_ROOT = tmp_path / "control"
    known = TrainingJob.objects.create(workspace=demo.workspace, created_by=demo.owner, name="kept", image=BUSYBOX)
    deleted, fresh = str(uuid.uuid4()), str(uuid.uuid4())
    data = settings.JOB_DATA_ROOT
    parents = [data / LOCAL_CODE_STAGING, data / SSH_STAGING, control.control_root()]
    gone = [folder(parent, deleted, age_s=3600) for parent in parents]
    kept = [folder(parent, str(known.id), age_s=3600) for parent in parents]
    kept.append(folder(parents[1], fresh, age_s=0))  # a job being made or just deleted: later
    kept.append(folder(parents[1], "not-a-job", age_s=3600))
    # A link named like a job (no job can write here, but nothing is followed anyway) and its target.
    outside = folder(tmp_path / "outside", "data", age_s=3600)
    link = parents[0] / str(uuid.uuid4())
    link.symlink_to(outside, target_is_directory=True)

    assert cleanup.remove_files_of_unknown_jobs(timezone.now() - timezone.timedelta(seconds=600))
    assert [f for f in gone if f.exists()] == []
    assert all(f.is_dir() for f in kept)
    assert link.is_symlink() and (outside / "id_ed25519").read_text() == "secret"
    assert not cleanup.remove_files_of_unknown_jobs(timezone.now() - timezone.timedelta(seconds=600)), "done once"
