"""Mounted data keeps its owner (docs/decisions.md "Mounted data keeps its owner").

The console never changes the owner or modes of data it mounts or saves: an operator's folder
mounted into a job stays the operator's (the job, uid 1000, writes there only where its modes
allow); an editor save keeps the file's owner; what the console makes itself in object storage
belongs to settings.STORAGE_OWNER (the operator's mapping, default uid 1000: the jobs' user), and
an artifact folder made for a job is the job's. Needs a console running as root (as here and in
CI): a console that cannot chown writes everything as its own user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from jobs import storage
from jobs.models import Phase
from jobs.runtime import schedule
from jobs.runtime.staging import prepare_sources
from tests.folders import bucket
from tests.helpers import BUSYBOX, dedicated_pool, ended, instance_of, log_texts, run_of, unsaved, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ownership needs a console running as root")

OPERATOR = (2000, 2000)  # an operator's data: neither the console's nor the jobs' user


def owned(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def operator_folder(path: Path) -> Path:
    """A folder and a file of the operator's, readable by everyone, writable by the operator only."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "data.txt").write_text("operator data\n")
    for item, mode in ((path, 0o755), (path / "data.txt", 0o644)):
        os.chown(item, *OPERATOR)
        os.chmod(item, mode)
    return path


PROBE = """
probe() { if touch "$1/probe" 2>/dev/null; then echo "$2 rw"; else echo "$2 ro"; fi; }
cat /mnt/operator/data.txt; probe /mnt/operator operator
probe "$MA_ARTIFACT_DIR" artifacts
"""


def test_a_mounted_operator_folder_keeps_its_owner_and_the_job_writes_only_where_allowed(demo, worker):
    pool = dedicated_pool(demo)
    theirs = operator_folder(bucket("good") / "operator")
    before = {p: owned(p) for p in (theirs, theirs / "data.txt")}
    job = unsaved(
        demo,
        name="mounts-owner",
        image=BUSYBOX,
        command=PROBE,
        pool_type="dedicated",
        pool=pool,
        spec_type="custom",
        custom_cpus=1,
        custom_memory_gb=0.5,
        obs_mounts=[{"obs_url": "obs://good/operator/", "mount_path": "/mnt/operator"}],
        store_artifacts=True,
        artifact_path="obs://good/run-1/",  # made for the job: its own
    )
    job.full_clean()
    job.save()
    schedule.submit(job)
    run = run_of(job)
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    assert log_texts(run) == ["operator data", "operator ro", "artifacts rw"]
    assert {p: owned(p) for p in before} == before  # nothing was given to the job's user
    assert not (theirs / "probe").exists()
    assert (bucket("good") / "run-1" / "probe").stat().st_uid == 1000


def test_an_artifact_folder_made_for_the_job_is_its_own_an_existing_one_keeps_its_owner(demo):
    bucket("art-b")
    theirs = operator_folder(bucket("art-b") / "existing")
    before = owned(theirs)
    for path, expected in (("obs://art-b/existing/", before), ("obs://art-b/made/", (1000, 1000))):
        job = unsaved(demo, name="art", image=BUSYBOX, command="true", store_artifacts=True, artifact_path=path)
        job.full_clean()
        job.save()
        attempt, task_run = instance_of(job, demo)
        prepare_sources(job, attempt, task_run)
        assert owned(storage.local_path(path))[:2] == expected[:2], path
    assert owned(theirs) == before


def test_an_editor_save_keeps_the_files_owner_and_a_new_file_is_the_storage_owners(demo, settings):
    settings.STORAGE_OWNER = (1234, 1235)
    folder = operator_folder(bucket("code-b") / "edit")
    storage.write_text("obs://code-b/edit/data.txt", "changed\n")
    assert owned(folder / "data.txt") == (*OPERATOR, 0o644)
    assert (folder / "data.txt").read_text() == "changed\n"
    os.chmod(folder, 0o777)  # so that the console's own save may create a file in it
    storage.write_text("obs://code-b/edit/new.py", "print(1)\n")
    assert owned(folder / "new.py")[:2] == (1234, 1235)


def test_folders_the_console_makes_in_storage_are_the_storage_owners(demo, settings):
    settings.STORAGE_OWNER = (1234, 1235)
    bucket("logs-b")
    with storage.open_folder("obs://logs-b/made/", create=True):
        pass
    assert owned(storage.local_path("obs://logs-b/made/"))[:2] == (1234, 1235)
