"""The job fields the wizard accepts reach the containers (SPEC §3, SPEC §8): env vars, the
local code dir and the code folder, the code backup, datasets, artifacts, file system and
object storage mounts, resource limits; and the runtime environment preview lists exactly
what the containers get. Real containers, a real worker and object storage on disk, except
where named: there is no NFS server here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings

from jobs import storage
from jobs import validators as v
from jobs.models import Dataset, FileSystem, Flavor, Phase, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, engine, schedule
from jobs.runtime.layout import DATA_MOUNT_ROOT, layout_environment, runtime_layout
from jobs.runtime.staging import StagingError, mounts_for, prepare_sources, volume_labels
from tests.folders import bucket
from tests.helpers import BUSYBOX, dedicated_pool, ended, instance_of, log_texts, run_of, submit_job, unsaved, wait_for
from tests.pytest_env import TMP

pytestmark = pytest.mark.django_db(transaction=True)


# -- helpers ---------------------------------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- the preview (no container) ----------------------------------------------------------------------------
def test_runtime_layout_of_an_unsaved_job_lists_every_directory(demo):
    preset = Dataset.objects.create(name="mnist", path="obs://data-b/mnist/")
    mine = Dataset.objects.create(name="mnist", path="obs://data-b/my-mnist/", owner=demo.owner)
    odd = Dataset.objects.create(name="Fashion MNIST/v2", path="obs://data-b/fashion/")
    job = unsaved(
        demo,
        code_dir="obs://code-b/src/train-code/",  # need not exist for a preview
        datasets=[mine.id, preset.id, str(odd.id)],  # the wizard may still hold ids as strings
        store_artifacts=True,
        artifact_path="obs://out-b/run/",
    )
    assert job._state.adding and not job.name

    layout = runtime_layout(job)
    local = v.DEFAULT_LOCAL_CODE_DIR
    assert [(e.container_path, e.mode, e.what, e.mounted) for e in layout] == [
        (local, "rw", "Local code dir (MA_JOB_DIR)", True),
        (f"{local}/train-code", "rw", "Code folder (copied at each container start)", False),
        (f"{DATA_MOUNT_ROOT}/mnist", "ro", "Dataset mnist", True),
        (f"{DATA_MOUNT_ROOT}/mnist-2", "ro", "Dataset mnist", True),
        (f"{DATA_MOUNT_ROOT}/Fashion_MNIST_v2", "ro", "Dataset Fashion MNIST/v2", True),
        (v.DEFAULT_ARTIFACT_MOUNT_PATH, "rw", "Artifacts", True),
        ("/job-data", "rw", "Job data (MA_CHECKPOINT_DIR)", True),
        ("/cache", "rw", "Cache", True),
    ]
    assert [e.source for e in layout[1:6]] == [
        "obs://code-b/src/train-code/",
        "obs://data-b/my-mnist/",
        "obs://data-b/mnist/",
        "obs://data-b/fashion/",
        "obs://out-b/run/",
    ]
    assert layout_environment(job, layout) == {
        "MA_JOB_DIR": local,
        "MA_CODE_DIR": f"{local}/train-code",
        "MA_DATASET_0_DIR": f"{DATA_MOUNT_ROOT}/mnist",
        "MA_DATASET_1_DIR": f"{DATA_MOUNT_ROOT}/mnist-2",
        "MA_DATASET_2_DIR": f"{DATA_MOUNT_ROOT}/Fashion_MNIST_v2",
        "MA_DATASET_DIRS": ":".join(f"{DATA_MOUNT_ROOT}/{n}" for n in ("mnist", "mnist-2", "Fashion_MNIST_v2")),
        "MA_ARTIFACT_DIR": v.DEFAULT_ARTIFACT_MOUNT_PATH,
    }
    assert not TrainingJob.objects.exists()  # a preview saves nothing


def test_runtime_layout_lists_mounts_on_a_dedicated_pool_only(demo):
    FileSystem.objects.create(name="shared", kind=FileSystem.Kind.HOST_DIR, source="/srv/shared")
    mounts = dict(
        file_system_mounts=[
            {"file_system": "shared", "path": "/a", "mount_path": "/mnt/a", "read_only": True, "options": ""},
            {"file_system": "gone", "path": "/", "mount_path": "/mnt/b/", "read_only": False, "options": ""},
        ],
        obs_mounts=[{"obs_url": "obs://bkt/x/", "mount_path": "/mnt/obs"}],
        local_code_dir="/home/ma-user/work",
    )
    dedicated = runtime_layout(unsaved(demo, pool_type="dedicated", **mounts))
    assert [(e.container_path, e.source, e.mode, e.what) for e in dedicated[1:4]] == [
        ("/mnt/obs", "obs://bkt/x/", "rw", "Object storage mount"),
        ("/mnt/a", "file system shared:/a", "ro", "File system mount"),
        ("/mnt/b", "file system gone:/ (missing)", "rw", "File system mount"),
    ]
    assert dedicated[0].container_path == "/home/ma-user/work"
    # The public pool has no mounts (validation refuses them there; a preview just leaves them out).
    public = runtime_layout(unsaved(demo, **mounts))
    assert [e.container_path for e in public] == ["/home/ma-user/work", "/job-data", "/cache"]


def test_nfs_file_system_mount_kwargs_only_no_nfs_server_to_mount_here(demo):
    """NFS cannot be mounted in this test environment (no NFS server): the Docker mount the
    console asks for is checked instead: a volume of the local driver with type=nfs."""
    FileSystem.objects.create(name="turbo", kind=FileSystem.Kind.NFS, source="nfs.example:/export/data")
    job = unsaved(
        demo,
        pool_type="dedicated",
        file_system_mounts=[
            {"file_system": "turbo", "path": "/team/a", "mount_path": "/mnt/turbo", "read_only": True, "options": ""},
            {
                "file_system": "turbo",
                "path": "/",
                "mount_path": "/mnt/turbo-all",
                "read_only": False,
                "options": "vers=4,hard",
            },
        ],
    )
    attempt, task_run = instance_of(job, demo)
    mounts = {m["Target"]: m for m in mounts_for(job, attempt, task_run)}
    assert mounts["/mnt/turbo"] == {
        "Target": "/mnt/turbo",
        "Source": f"console-nfs-{job.id.hex[:12]}-1",
        "Type": "volume",
        "ReadOnly": True,
        "VolumeOptions": {
            "DriverConfig": {
                "Name": "local",
                "Options": {
                    "type": "nfs",
                    "o": f"addr=nfs.example,{v.DEFAULT_NFS_OPTIONS}",
                    "device": ":/export/data/team/a",
                },
            },
            # labelled with the job, so cleanup.py finds (and removes) it once the job ended
            "Labels": volume_labels(job, "nfs"),
            "NoCopy": True,  # the image's files never land on the export
        },
    }
    whole = mounts["/mnt/turbo-all"]
    assert (whole["Source"], whole["ReadOnly"]) == (f"console-nfs-{job.id.hex[:12]}-2", False)
    assert whole["VolumeOptions"]["DriverConfig"]["Options"] == {
        "type": "nfs",
        "o": "addr=nfs.example,vers=4,hard",
        "device": ":/export/data",
    }


def test_user_env_vars_cannot_override_the_console_control_variables(demo):
    # Saved around validation (which refuses these names): the console's values still win.
    job = unsaved(
        demo,
        name="envs",
        command="true",
        environments=[
            {"name": "RANK", "value": "7", "sensitive": False},
            {"name": "MA_JOB_DIR", "value": "/elsewhere", "sensitive": False},
            {"name": "PYTHONUNBUFFERED", "value": "", "sensitive": False},
            {"name": "MY_FLAG", "value": "on", "sensitive": True},
        ],
    )
    attempt, task_run = instance_of(job, demo)
    env = docker_hosts.container_environment(job, attempt, task_run)
    assert (env["RANK"], env["MA_JOB_DIR"], env["MY_FLAG"]) == ("0", v.DEFAULT_LOCAL_CODE_DIR, "on")
    assert env["PYTHONUNBUFFERED"] == ""  # a default, not a control variable: the job's value stands
    assert env["MA_OPERATOR_REEXECUTION"] == "0"


def test_resource_limits_come_from_the_custom_spec_or_the_flavor(demo):
    pool = dedicated_pool(demo)
    custom = unsaved(demo, pool_type="dedicated", pool=pool, spec_type="custom", custom_cpus=1.5, custom_memory_gb=2)
    assert docker_hosts.resource_kwargs(custom, pool) == {
        "nano_cpus": 1_500_000_000,
        "mem_limit": "2048m",
        "memswap_limit": "2048m",
        "pids_limit": pool.pids_limit,
    }
    flavor = Flavor.objects.create(name="cpu.2u4g", cpus=2, memory_mb=4096)
    assert docker_hosts.resource_kwargs(unsaved(demo, flavor=flavor))["nano_cpus"] == 2_000_000_000
    # Without a flavor or spec: the pool's operator defaults, never unlimited.
    pool.default_cpus, pool.default_memory_mb, pool.pids_limit = 0.5, 512, 128
    assert docker_hosts.resource_kwargs(unsaved(demo), pool) == {
        "nano_cpus": 500_000_000,
        "mem_limit": "512m",
        "memswap_limit": "512m",
        "pids_limit": 128,
    }


def test_a_missing_code_dir_or_dataset_is_refused_at_start_with_its_name(demo):
    dataset = Dataset.objects.create(name="gone-data", path="obs://nowhere-b/data/")
    job = unsaved(demo, name="missing", code_dir="obs://nowhere-b/code/")
    attempt, task_run = instance_of(job, demo)
    with pytest.raises(StagingError, match="Code dir: 'obs://nowhere-b/code/' does not exist in object storage"):
        prepare_sources(job, attempt, task_run)
    job.code_dir = ""
    job.datasets = [dataset.id]
    with pytest.raises(StagingError, match="Dataset gone-data: 'obs://nowhere-b/data/' does not exist"):
        prepare_sources(job, attempt, task_run)


def test_a_dataset_missing_from_object_storage_fails_the_start_with_its_name(demo, worker):
    # Validation checks the catalogue (online, whose); the folder itself is looked at when the container is made.
    dataset = Dataset.objects.create(name="vanished", path="obs://gone-b/data/")
    job = submit_job(demo, name="nodata", datasets=[dataset.id])
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    assert job.phase == Phase.FAILED
    assert "Dataset vanished: 'obs://gone-b/data/' does not exist in object storage." in job.phase_reason
    run = job.attempts.get().task_runs.get()
    assert run.state == TaskRun.State.START_FAILED and not run.container_id


# -- real containers -------------------------------------------------------------------------------------------
ENV_COMMAND = (
    'echo "GREETING=$GREETING"; echo "API_TOKEN=$API_TOKEN"; echo "MA_JOB_DIR=$MA_JOB_DIR"; '
    'echo "MA_CODE_DIR=$MA_CODE_DIR"; echo "MA_OPERATOR_REEXECUTION=$MA_OPERATOR_REEXECUTION"; '
    'echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE"; '
    "cd ${MA_JOB_DIR}/proj && cat hello.txt && echo changed > hello.txt && touch made-in-job && echo code-writable"
)


def test_env_vars_and_the_code_folder_reach_the_container_and_the_code_is_backed_up(demo, worker):
    code = bucket("code-b") / "src" / "proj"
    write(code / "hello.txt", "hello from object storage\n")
    write(code / "lib" / "util.py", "X = 1\n")
    job = submit_job(
        demo,
        name="envjob",
        command=ENV_COMMAND,
        code_dir="obs://code-b/src/proj/",
        code_backup_dir="obs://code-b/backup/",
        local_code_dir="/home/ma-user/work",
        operator_reexecution=True,
        environments=[
            {"name": "GREETING", "value": "hello world", "sensitive": False},
            {"name": "API_TOKEN", "value": "s3cret", "sensitive": True},
        ],
    )
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    lines = log_texts(job.attempts.get().task_runs.get())
    assert job.phase == Phase.COMPLETED, (job.phase_reason, lines)
    assert lines == [
        "GREETING=hello world",
        "API_TOKEN=s3cret",  # masked on pages and in the API, never in the container
        "MA_JOB_DIR=/home/ma-user/work",
        "MA_CODE_DIR=/home/ma-user/work/proj",
        "MA_OPERATOR_REEXECUTION=1",
        "RANK=0 WORLD_SIZE=1",
        "hello from object storage",
        "code-writable",
    ]
    # The container worked on a copy: the code in object storage is untouched.
    assert (code / "hello.txt").read_text() == "hello from object storage\n"
    assert not (code / "made-in-job").exists()
    # SPEC §3: <backup dir>/<job>-<task>-<index>/user-job-dir/<folder>, copied at start.
    backup = storage.local_path("obs://code-b/backup/") / "envjob-worker-0" / "user-job-dir" / "proj"
    assert (backup / "hello.txt").read_text() == "hello from object storage\n"
    assert (backup / "lib" / "util.py").read_text() == "X = 1\n"


PROBE_COMMAND = """
probe() { if touch "$1/probe-$2" 2>/dev/null; then echo "$2 rw"; else echo "$2 ro"; fi; }
cat "$MA_DATASET_0_DIR/labels.txt"; probe "$MA_DATASET_0_DIR" dataset
cat /mnt/fs-ro/note.txt; probe /mnt/fs-ro fs-ro
probe /mnt/fs-rw fs-rw
cat /mnt/obs/readme.txt; probe /mnt/obs obs
probe "$MA_ARTIFACT_DIR" artifacts
probe "$MA_JOB_DIR" local-code
probe /cache cache
echo probes-done
until [ -e /job-data/go ]; do sleep 0.1; done
"""


def test_dedicated_job_mounts_match_the_preview_and_honour_read_only(demo, worker, docker_client):
    pool = dedicated_pool(demo)
    write(bucket("data-b") / "digits" / "labels.txt", "0 1 2 3\n")
    dataset = Dataset.objects.create(name="digits", path="obs://data-b/digits/")
    write(bucket("mnt-b") / "shared" / "readme.txt", "from the bucket\n")
    os.chown(bucket("mnt-b") / "shared", *settings.STORAGE_OWNER)  # as the console makes folders in storage
    bucket("out-b")
    shared = Path(TMP) / "fs-shared"
    write(shared / "ro" / "note.txt", "operator data\n")
    FileSystem.objects.create(name="shared", kind=FileSystem.Kind.HOST_DIR, source=str(shared)).workspaces.add(
        demo.workspace
    )
    job = unsaved(
        demo,
        name="mounts",
        image=BUSYBOX,
        command=PROBE_COMMAND,
        pool_type="dedicated",
        pool=pool,
        spec_type="custom",
        custom_cpus=1,
        custom_memory_gb=0.5,
        datasets=[dataset.id],
        store_artifacts=True,
        artifact_path="obs://out-b/run-1/",
        file_system_mounts=[
            {"file_system": "shared", "path": "/ro", "mount_path": "/mnt/fs-ro", "read_only": True},
            # The same file system again; /rw does not exist yet: it is made for the job, owned by ma-user.
            {"file_system": "shared", "path": "/rw", "mount_path": "/mnt/fs-rw", "read_only": False},
        ],
        obs_mounts=[{"obs_url": "obs://mnt-b/shared/", "mount_path": "/mnt/obs"}],
    )
    preview = runtime_layout(job)  # what the wizard shows before submitting
    job.full_clean()
    job.save()
    schedule.submit(job)

    run = run_of(job)
    wait_for(lambda: "probes-done" in log_texts(run), message="the probes")
    assert log_texts(run) == [
        "0 1 2 3",
        "dataset ro",
        "operator data",
        "fs-ro ro",
        "fs-rw rw",
        "from the bucket",
        "obs rw",
        "artifacts rw",
        "local-code rw",
        "cache rw",
        "probes-done",
    ]
    attrs = docker_client.api.inspect_container(run.container_id)
    mounted = {(m["Destination"], m["RW"]) for m in attrs["Mounts"]}
    # The console's tools and control dir; and, one instance having no network of the engine's,
    # the /etc/hosts Docker would have written (docker_hosts.HOSTS_FILE), read-only.
    console_mounts = {*engine.CONSOLE_MOUNTS.items(), ("/etc/hosts", False)}
    assert mounted >= console_mounts
    mounted -= console_mounts
    assert mounted == {(e.container_path, e.mode == "rw") for e in preview if e.mounted}
    assert {e.container_path for e in preview if e.mounted} >= {
        v.DEFAULT_LOCAL_CODE_DIR,
        f"{DATA_MOUNT_ROOT}/digits",
        "/mnt/fs-ro",
        "/mnt/fs-rw",
        "/mnt/obs",
        v.DEFAULT_ARTIFACT_MOUNT_PATH,
        "/job-data",
        "/cache",
    }
    assert (attrs["HostConfig"]["NanoCpus"], attrs["HostConfig"]["Memory"]) == (10**9, 512 * 1024**2)
    # What the job wrote landed where the layout says, owned by ma-user.
    for written in (
        shared / "rw" / "probe-fs-rw",
        storage.local_path("obs://mnt-b/shared/") / "probe-obs",
        storage.local_path("obs://out-b/run-1/") / "probe-artifacts",
    ):
        assert written.stat().st_uid == 1000, written
    assert not (shared / "ro" / "probe-fs-ro").exists()
    assert not (storage.local_path("obs://data-b/digits/") / "probe-dataset").exists()

    Path(settings.JOB_DATA_ROOT, str(job.id), "go").touch()
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason


ARTIFACT_COMMAND = """
ckpt="$MA_ARTIFACT_DIR/ckpt.txt"
if [ -f "$ckpt" ]; then echo "attempt $MA_ATTEMPT found: $(cat "$ckpt")"; exit 0; fi
echo "saved by attempt $MA_ATTEMPT" > "$ckpt" && echo checkpoint-written
while true; do sleep 0.1; done
"""


def test_the_artifact_dir_survives_a_container_level_restart(demo, worker, docker_client):
    bucket("ckpt-b")
    job = submit_job(
        demo,
        name="artifacts",
        command=ARTIFACT_COMMAND,
        fault_tolerance=True,
        max_restarts=1,
        store_artifacts=True,
        artifact_path="obs://ckpt-b/job-1/",
        artifact_mount_path="/home/ma-user/ckpt",
    )
    first = run_of(job)
    wait_for(lambda: "checkpoint-written" in log_texts(first), message="the checkpoint")
    docker_client.containers.get(first.container_id).kill()  # SIGKILL from outside: a real fault

    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    second = job.attempts.get(number=2).task_runs.get()
    assert second.container_id != first.container_id  # a new container, not a process restart
    assert job.recoveries.get().level == "container"
    assert "attempt 2 found: saved by attempt 1" in log_texts(second)
    ckpt = storage.local_path("obs://ckpt-b/job-1/") / "ckpt.txt"
    assert ckpt.read_text() == "saved by attempt 1\n"
    assert os.stat(ckpt).st_uid == 1000


def test_nfs_options_that_point_the_mount_elsewhere_fail_the_start(demo):
    """Options that say where the server is are refused at submission (tests/spec_cases.py); a job
    saved before that rule, or whose row was changed since, is refused again when its container is
    made: the engine would mount, as root on the host's network, what its last `addr=` names."""
    FileSystem.objects.create(name="turbo", kind=FileSystem.Kind.NFS, source="nfs.example:/export/data")
    mount = {"file_system": "turbo", "path": "/", "mount_path": "/mnt/turbo", "read_only": False}
    job = unsaved(demo, pool_type="dedicated", file_system_mounts=[mount | {"options": "vers=3,addr=127.0.0.1"}])
    attempt, task_run = instance_of(job, demo)
    refused = r"File system mount /mnt/turbo: Mount options cannot set 'addr=127\.0\.0\.1'"
    with pytest.raises(StagingError, match=refused):
        mounts_for(job, attempt, task_run)
