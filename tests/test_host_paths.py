"""Host folders given to jobs are confined (SPEC §8): a symbolic link or '..' planted by any job
leads the console (root) nowhere outside that job's own folders.

The primitives of jobs/runtime/hostpaths.py on plain folders first (links in the middle, at
the leaf, '..', a folder swapped for a link after it was opened), then what the console does
for a job (file system mounts, the code backup, the summary folder, artifacts, the log export,
the code copy), and the two escapes as real attacks: a job plants the link, the next one is
refused, and the host outside is untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import storage
from jobs.models import Attempt, Phase, TaskRun, TrainingJob
from jobs.runtime import outputs, schedule
from jobs.runtime.hostpaths import (
    PathEscape,
    confined,
    copytree_into,
    is_dir_at,
    makedirs_confined,
    open_dir,
    parts,
    read_file,
    remove_at,
    replace_dir,
    rmtree_confined,
    write_file,
)
from jobs.runtime.layout import local_code_dir
from jobs.runtime.staging import StagingError, backup_code, mounts_for, prepare_sources, stage_local_code
from tests.folders import bucket, host_dir, snapshot
from tests.helpers import dedicated_pool, ended, instance_of, unsaved, wait_for


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder standing for /etc: what no job may make the console read, write or mount."""
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "passwd").write_text("root:x:0:0\n")
    (folder / "sub").mkdir()
    return folder


@pytest.fixture
def root(tmp_path) -> Path:
    folder = tmp_path / "root"
    folder.mkdir()
    return folder


# -- the primitives -------------------------------------------------------------------------------------------
def test_parts_refuse_dotdot_and_skip_empty_and_dot():
    assert parts("/a//b/./c/") == ["a", "b", "c"]
    assert parts("") == parts("/") == []
    for bad in ("..", "a/../b", "a/..", "/../etc"):
        with pytest.raises(PathEscape, match="is not allowed"):
            parts(bad)


def test_confined_refuses_a_link_in_the_middle_at_the_leaf_and_dotdot(root, outside):
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "middle").symlink_to(outside)
    (root / "a" / "leaf").symlink_to(outside)
    (root / "a" / "inside").symlink_to(root / "a" / "b")  # even a link that stays inside: never followed
    (root / "a" / "dangling").symlink_to(outside / "nothing")
    assert confined(root, "a/b") == root / "a" / "b"
    assert confined(root, "/a/b/not/yet") == root / "a" / "b" / "not" / "yet"  # a missing tail: nothing to follow
    cases = {
        "a/middle/sub": "a/middle",
        "a/leaf": "a/leaf",
        "a/inside": "a/inside",
        "a/dangling/x": "a/dangling",
        "a/b/../middle": "a/b/..",
    }
    for relative, at in cases.items():
        with pytest.raises(PathEscape) as caught:
            confined(root, relative)
        assert caught.value.at == at, relative
    with pytest.raises(NotADirectoryError):
        (root / "file").write_text("x")
        confined(root, "file/x")


def test_the_root_itself_may_be_a_link_it_is_the_operators(tmp_path, root):
    (root / "a").mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    assert confined(alias, "a") == alias / "a"
    with open_dir(alias, "a") as fd:
        assert os.path.samestat(os.fstat(fd), (root / "a").stat())


def test_makedirs_confined_makes_only_inside_and_gives_the_new_leaf(root, outside):
    made = makedirs_confined(root, "x/y/z", owner=(1000, 1000))
    assert made.is_dir() and made.stat().st_uid == 1000
    assert (root / "x").stat().st_uid == os.geteuid()  # folders on the way stay the console's
    (root / "mine").mkdir()
    makedirs_confined(root, "mine", owner=(1000, 1000))
    assert (root / "mine").stat().st_uid == os.geteuid()  # an existing folder keeps its owner
    (root / "x" / "link").symlink_to(outside)
    (root / "x" / "dangling").symlink_to(outside / "new")
    before = snapshot(outside)
    for relative in ("x/link/made", "x/dangling", "x/dangling/made"):
        with pytest.raises(PathEscape):
            makedirs_confined(root, relative, owner=(1000, 1000))
    assert snapshot(outside) == before and not (outside / "new").exists()


def test_work_through_an_opened_folder_stays_there_when_it_is_swapped_for_a_link(root, outside):
    """The race a check-then-use would lose: the folder is replaced by a link after it was opened."""
    (root / "job" / "out").mkdir(parents=True)
    with open_dir(root, "job/out") as fd:
        os.rename(root / "job" / "out", root / "job" / "moved")
        (root / "job" / "out").symlink_to(outside)  # planted between the check and the write
        write_file(fd, "passwd", b"owned\n")
    assert (outside / "passwd").read_text() == "root:x:0:0\n"
    assert (root / "job" / "moved" / "passwd").read_bytes() == b"owned\n"
    with pytest.raises(PathEscape):  # opened again, the link is refused
        with open_dir(root, "job/out"):
            pass


def test_write_file_replaces_a_link_at_the_leaf_and_never_writes_through_it(root, outside):
    (root / "logs").mkdir()
    (root / "logs" / "worker-0.log").symlink_to(outside / "passwd")
    with open_dir(root, "logs") as fd:
        write_file(fd, "worker-0.log", ["line ", b"one\n"], mode=0o640)
        with pytest.raises(PathEscape):
            (root / "logs" / "link").symlink_to(outside / "passwd")
            read_file(fd, "link")
        assert read_file(fd, "worker-0.log") == b"line one\n"
    log = root / "logs" / "worker-0.log"
    assert not log.is_symlink() and log.stat().st_mode & 0o777 == 0o640
    assert (outside / "passwd").read_text() == "root:x:0:0\n"
    assert sorted(p.name for p in (root / "logs").iterdir()) == ["link", "worker-0.log"]  # no temporary left


def test_copytree_into_copies_links_as_links_and_nothing_else_special(root, outside, tmp_path):
    before = snapshot(outside)
    src = root / "code"
    (src / "lib").mkdir(parents=True)
    (src / "run.sh").write_text("echo hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "lib" / "util.py").write_text("X = 1\n")
    (src / "etc").symlink_to(outside)  # absolute, out of the tree
    (src / "lib" / "up").symlink_to("../../../etc/passwd")
    (src / "suid").write_text("#!/bin/sh\n")
    (src / "suid").chmod(0o4755)
    os.mkfifo(src / "fifo")  # opening it would block a plain copy
    dst = tmp_path / "dst"
    dst.mkdir()
    with open_dir(root, "code") as s, open_dir(tmp_path, "dst") as d:
        copytree_into(s, d, owner=(1000, 1000))
    got = snapshot(dst)
    assert set(got) == {"lib", "lib/util.py", "lib/up", "run.sh", "etc", "suid"}  # the fifo is left out
    assert os.readlink(dst / "etc") == str(outside) and os.readlink(dst / "lib" / "up") == "../../../etc/passwd"
    assert got["run.sh"][1:] == (0o755, 1000, b"echo hi\n")
    assert got["suid"][1] == 0o755  # a set-uid bit is never copied
    assert all(entry[2] == 1000 for entry in got.values())
    assert snapshot(outside) == before


def test_copy_refuses_a_source_that_is_a_link(root, outside):
    (root / "local").mkdir()
    (root / "local" / "proj").symlink_to(outside)  # the job replaced its code folder by a link
    with pytest.raises(PathEscape) as caught:
        with open_dir(root, "local/proj"):
            pass
    assert caught.value.at == "local/proj" and "'local/proj' is a symbolic link" in str(caught.value)


def test_replace_dir_and_remove_at_act_on_names_only(root, outside):
    (root / "backup").mkdir()
    (root / "backup" / "proj").symlink_to(outside)  # planted where the previous backup was
    (root / "backup" / ".new").mkdir()
    (root / "backup" / ".new" / "train.py").write_text("print(1)\n")
    before = snapshot(outside)
    with open_dir(root, "backup") as fd:
        replace_dir(fd, ".new", "proj")
        assert is_dir_at(fd, "proj")
        os.symlink(str(outside), "link", dir_fd=fd)
        remove_at(fd, "link")
        remove_at(fd, "missing")
    assert (root / "backup" / "proj" / "train.py").read_text() == "print(1)\n"
    assert sorted(os.listdir(root / "backup")) == ["proj"]
    assert snapshot(outside) == before


def test_rmtree_confined_never_follows_a_link(root, outside):
    (root / "a" / "tree").mkdir(parents=True)
    (root / "a" / "tree" / "etc").symlink_to(outside)
    (root / "a" / "via").symlink_to(root / "a" / "tree")
    before = snapshot(outside)
    with pytest.raises(PathEscape):
        rmtree_confined(root, "a/via/etc")
    rmtree_confined(root, "a/tree")
    rmtree_confined(root, "a/via")  # the link itself goes
    rmtree_confined(root, "a/nothing/here")
    with pytest.raises(ValueError):
        rmtree_confined(root, "")
    assert os.listdir(root / "a") == [] and snapshot(outside) == before


# -- object storage ----------------------------------------------------------------------------------------
@pytest.fixture
def obs(settings, tmp_path) -> Path:
    top = tmp_path / "object-storage"
    (top / "b01" / "code").mkdir(parents=True)
    settings.OBJECT_STORAGE_ROOT = str(top)
    return top


def test_object_storage_folders_for_jobs_refuse_links_below_the_bucket(obs, outside):
    (obs / "b01" / "code" / "out").symlink_to(outside)
    (obs / "b01" / "alias").symlink_to(obs / "b01" / "code")  # inside the bucket: still not followed
    for url, shown in (("obs://b01/code/out/", "obs://b01/code/out/"), ("obs://b01/alias/x/", "obs://b01/alias/")):
        with pytest.raises(storage.StorageError, match=f"'{shown}' is a symbolic link: the console never follows"):
            storage.confined_path(url)
        with pytest.raises(storage.StorageError, match="is a symbolic link"):
            with storage.open_folder(url, create=True):
                pass
    assert storage.confined_path("obs://b01/code/new/") == (obs / "b01" / "code" / "new").resolve()
    with pytest.raises(storage.StorageError, match="does not exist in object storage"):
        with storage.open_folder("obs://nobucket/x/", create=True):  # never a bucket made as a side effect
            pass
    assert not (obs / "nobucket").exists() and sorted(os.listdir(outside)) == ["passwd", "sub"]


def test_the_editor_saves_through_the_resolved_folder_only(obs, outside):
    (obs / "b01" / "code" / "run.sh").write_text("echo 1\n")
    (obs / "b01" / "code" / "run.sh").chmod(0o755)
    storage.write_text("obs://b01/code/run.sh", "echo 2\n")
    assert storage.read_text("obs://b01/code/run.sh") == "echo 2\n"
    with open_dir(obs, "b01/code") as fd, pytest.raises(OSError, match="larger than 3 bytes"):
        read_file(fd, "run.sh", max_bytes=3)
    assert (obs / "b01" / "code" / "run.sh").read_text() == "echo 2\n"
    assert (obs / "b01" / "code" / "run.sh").stat().st_mode & 0o777 == 0o755
    with pytest.raises(storage.StorageError, match="leaves its bucket"):
        (obs / "b01" / "code" / "out").symlink_to(outside)
        storage.write_text("obs://b01/code/out/passwd.txt", "owned\n")
    assert sorted(os.listdir(outside)) == ["passwd", "sub"]


# -- what the console does for a job (no container) --------------------------------------------------------
pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
def test_file_system_summary_and_artifact_folders_refuse_planted_links(demo, tmp_path, outside):
    fs, folder = host_dir("planted")
    (folder / "team").mkdir()
    (folder / "team" / "root").symlink_to("/")
    (folder / "summaries").symlink_to(outside)  # a job with the file system mounted at its root did this
    before = snapshot(outside)
    for path in ("/team/root", "/team/root/etc", f"/team/root{outside}/made"):
        job = unsaved(
            demo,
            name="fsjob",
            pool_type="dedicated",
            file_system_mounts=[{"file_system": "planted", "path": path, "mount_path": "/mnt/x", "read_only": False}],
        )
        attempt, task_run = instance_of(job, demo)
        message = "File system mount: 'planted:/team/root' is a symbolic link: the console never follows a link"
        with pytest.raises(StagingError, match=message):
            prepare_sources(job, attempt, task_run)
        with pytest.raises(StagingError, match=message):
            mounts_for(job, attempt, task_run)
    assert not Path(outside, "made").exists()

    job = unsaved(demo, name="tb", pool_type="dedicated", tensorboard=True, observe_file_system=fs)
    attempt, task_run = instance_of(job, demo)
    with pytest.raises(StagingError, match="TensorBoard summaries .*: 'planted:/summaries' is a symbolic link"):
        prepare_sources(job, attempt, task_run)
    with pytest.raises(StagingError, match="'planted:/summaries' is a symbolic link"):
        mounts_for(job, attempt, task_run)

    (bucket("art-b") / "jobs").symlink_to(outside)
    job = unsaved(demo, name="art", store_artifacts=True, artifact_path="obs://art-b/jobs/run-1/")
    attempt, task_run = instance_of(job, demo)
    with pytest.raises(StagingError, match="Artifacts: 'obs://art-b/jobs/' is a symbolic link"):
        prepare_sources(job, attempt, task_run)
    assert snapshot(outside) == before


@pytestmark_db
def test_the_code_copy_and_backup_never_read_or_write_through_a_link(demo, outside):
    code = bucket("copy-b") / "src" / "proj"
    code.mkdir(parents=True, exist_ok=True)
    (code / "train.py").write_text("print('hi')\n")
    (code / "etc").symlink_to(outside)  # a link in the code: copied as a link
    job = unsaved(demo, name="copy", code_dir="obs://copy-b/src/proj/", code_backup_dir="obs://copy-b/backup/")
    job.save()
    attempt, task_run = instance_of(job, demo)
    local = stage_local_code(job, attempt, task_run)
    assert (local / "proj" / "train.py").stat().st_uid == 1000
    assert os.readlink(local / "proj" / "etc") == str(outside)
    backup = backup_code(job, task_run, local)
    assert backup == storage.local_path("obs://copy-b/backup/copy-worker-0/user-job-dir/proj/")
    assert (backup / "train.py").read_text() == "print('hi')\n" and (backup / "etc").is_symlink()

    # The job replaces its own code folder by a link to the host (a start of the same attempt
    # retried reuses the copy): the backup refuses to read it.
    (local / "proj").rename(local / "moved")
    (local / "proj").symlink_to(outside)
    before = snapshot(outside)
    with pytest.raises(StagingError, match=f"Code backup: {local_code_dir(job)}/proj of this instance is a symbolic"):
        backup_code(job, task_run, local)
    assert snapshot(outside) == before
    assert (backup / "train.py").read_text() == "print('hi')\n"  # the previous backup stays

    # The code dir itself is a link in the bucket: the copy refuses it.
    (bucket("copy-b") / "linked").symlink_to(outside)
    job.code_dir = "obs://copy-b/linked/"
    with pytest.raises(StagingError, match="Code dir: 'obs://copy-b/linked/' is a symbolic link"):
        stage_local_code(job, Attempt(job=job, number=2), task_run)


@pytestmark_db
def test_the_log_export_refuses_a_planted_link_and_writes_nothing_elsewhere(demo):
    job = unsaved(demo, name="logs", keep_logs=True, log_export_path="obs://logs-b/training/")
    job.phase, job.ended_at = Phase.COMPLETED, timezone.now()
    job.save()
    attempt = Attempt.objects.create(job=job, number=1)
    TaskRun.objects.create(attempt=attempt, index=0, host=demo.host, container_name="c0", state=TaskRun.State.EXITED)
    (bucket("logs-b") / "training").mkdir(exist_ok=True)
    other = bucket("logs-b") / "other-job"  # another job's folder in the same bucket
    other.mkdir()
    # Planted by a job with the bucket mounted: a link that stays in the bucket (resolving the
    # path would accept it) but leads the export into a folder that is not this job's.
    (bucket("logs-b") / "training" / f"logs-{job.id}").symlink_to(other)
    assert outputs.export_logs(job.id)
    job.refresh_from_db()
    assert f"'obs://logs-b/training/logs-{job.id}/' is a symbolic link" in job.logs_export_error
    assert os.listdir(other) == []


# -- the two escapes, as real attacks ------------------------------------------------------------------------------
def run_job(demo, pool, **fields) -> TrainingJob:
    defaults = dict(pool_type="dedicated", pool=pool, spec_type="custom", custom_cpus=0.5, custom_memory_gb=0.25)
    job = unsaved(demo, **(defaults | fields))
    job.full_clean()
    job.save()
    schedule.submit(job)
    wait_for(lambda: ended(job), timeout=60, message=f"job {job.name} to end")
    return job


def refused_at_start(job: TrainingJob, message: str) -> None:
    assert job.phase == Phase.FAILED and message in job.phase_reason, job.phase_reason
    run = job.attempts.get().task_runs.get()
    assert run.state == TaskRun.State.START_FAILED and not run.container_id  # no container was made


@pytestmark_db
def test_a_link_planted_in_a_file_system_by_a_job_cannot_mount_the_host(demo, worker, outside):
    pool = dedicated_pool(demo)
    fs, folder = host_dir("shared")
    os.chown(folder, 1000, 1000)  # a file system the operator gave to the jobs: ma-user writes in it
    # The first job plants a link to the host's / in the file system it may write.
    planter = run_job(
        demo,
        pool,
        name="planter",
        command="mkdir -p /mnt/s/team && ln -s / /mnt/s/team/root && echo planted",
        file_system_mounts=[{"file_system": "shared", "path": "/", "mount_path": "/mnt/s", "read_only": False}],
    )
    assert planter.phase == Phase.COMPLETED, planter.phase_reason
    assert os.readlink(folder / "team" / "root") == "/"
    before = snapshot(outside)

    # The next job mounts <that dir>/root: it would get the host's / (read-write), or make a
    # folder anywhere on the host. Refused at start, naming the path; no container is made.
    for name, path in (("reader", "/team/root"), ("maker", f"/team/root{outside}/made-by-job")):
        job = run_job(
            demo,
            pool,
            name=name,
            command="cat /mnt/host/etc/hostname; ls /mnt/host",
            file_system_mounts=[{"file_system": "shared", "path": path, "mount_path": "/mnt/host", "read_only": False}],
        )
        refused_at_start(job, "File system mount: 'shared:/team/root' is a symbolic link")
    assert snapshot(outside) == before and not (outside / "made-by-job").exists()
    assert sorted(os.listdir(folder / "team")) == ["root"]


@pytestmark_db
def test_a_link_planted_in_the_code_backup_dir_by_a_job_cannot_redirect_the_backup(demo, worker, outside):
    pool = dedicated_pool(demo)
    code = bucket("bk-code-b") / "src" / "proj"
    code.mkdir(parents=True, exist_ok=True)
    (code / "train.py").write_text("print('hi')\n")
    os.chown(bucket("bk-b"), 1000, 1000)
    # A job with the backup bucket mounted read-write plants <backup dir>/<job>-worker-0 -> "/etc".
    planter = run_job(
        demo,
        pool,
        name="planter",
        command=f"mkdir -p /mnt/b/backup && ln -s {outside} /mnt/b/backup/victim-worker-0 && echo planted",
        obs_mounts=[{"obs_url": "obs://bk-b/", "mount_path": "/mnt/b"}],
    )
    assert planter.phase == Phase.COMPLETED, planter.phase_reason
    assert os.readlink(storage.root() / "bk-b" / "backup" / "victim-worker-0") == str(outside)
    before = snapshot(outside)

    victim = run_job(
        demo,
        pool,
        name="victim",
        command="true",
        code_dir="obs://bk-code-b/src/proj/",
        code_backup_dir="obs://bk-b/backup/",
    )
    refused_at_start(victim, "Code backup dir: 'obs://bk-b/backup/victim-worker-0/' is a symbolic link")
    assert snapshot(outside) == before and not (outside / "user-job-dir").exists()
