"""Access and observe settings reach the containers (SPEC §3 "mutual-trust SSH files",
"SSH remote development", "TensorBoard", "MindStudio Insight", "JupyterLab"), through the
runtime layout, so that the preview lists them as the containers mount them. Real
containers and a real worker, except where named: there is no NFS server here."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from jobs import validators as v
from jobs.models import FileSystem, KeyPair, Phase, TaskRun, TrainingJob
from jobs.runtime import cleanup, docker_hosts, engine, schedule, ssh
from jobs.runtime.layout import layout_environment, runtime_layout
from jobs.runtime.staging import job_data_dir, mounts_for, prepare_sources
from tests.folders import host_dir
from tests.helpers import BUSYBOX, dedicated_pool, ended, instance_of, log_texts, submit_job, unsaved, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SSH_DIR = v.DEFAULT_MUTUAL_TRUST_DIR  # /home/ma-user/.ssh, also where SSH remote development puts its key


def running_runs(job: TrainingJob, count: int) -> list[TaskRun]:
    def runs():
        found = list(
            TaskRun.objects.filter(attempt__job=job, state=TaskRun.State.RUNNING)
            .exclude(container_id="")
            .order_by("index")
        )
        return found if len(found) == count else None

    return wait_for(runs, message=f"{count} running instances")


def user_key() -> str:
    return ssh.generate_key_pair("me@laptop")[1].decode().strip()


# -- the preview and the mounts (no container) -------------------------------------------------------------
def test_the_preview_lists_the_ssh_and_summary_dirs(demo):
    fs, _ = host_dir("summaries-fs")
    pool = dedicated_pool(demo)
    job = unsaved(
        demo,
        name="observed",
        pool_type="dedicated",
        pool=pool,
        mutual_trust=True,
        mutual_trust_dir="/opt/trust/",
        mindstudio_insight=True,
        observe_file_system=fs,
        observe_path="/home/ma-user/insight",
    )
    layout = runtime_layout(job)
    by_path = {e.container_path: e for e in layout}
    summary, trust = by_path["/home/ma-user/insight"], by_path["/opt/trust"]
    assert (summary.mode, summary.what, summary.mounted) == (
        "rw",
        "MindStudio Insight summaries (MA_SUMMARY_DIR)",
        True,
    )
    assert summary.source.startswith(f"file system summaries-fs:/summaries/observed-{job.id}/ (no MindStudio Insight")
    assert (trust.mode, trust.what) == ("ro", "Mutual-trust SSH files")
    assert layout_environment(job, layout)["MA_SUMMARY_DIR"] == "/home/ma-user/insight"
    assert not TrainingJob.objects.exists()  # a preview saves nothing

    key = KeyPair.objects.create(owner=demo.owner, name="laptop", public_key=user_key())
    remote = {e.container_path: e for e in runtime_layout(unsaved(demo, ssh_remote=True, ssh_key_pair=key))}
    assert (remote[SSH_DIR].mode, remote[SSH_DIR].what) == ("ro", "SSH remote development")
    assert "your key pair laptop; sshd is the image's to run" in remote[SSH_DIR].source
    assert "nothing can reach it" in remote[SSH_DIR].source  # one instance: network none

    # TensorBoard is a dedicated-pool setting: on the public pool the preview leaves it out.
    public = runtime_layout(unsaved(demo, tensorboard=True, observe_file_system=fs))
    assert [e.container_path for e in public] == [v.DEFAULT_LOCAL_CODE_DIR, "/job-data", "/cache"]


def test_an_nfs_summary_dir_is_a_volume_of_the_export_kwargs_only_no_nfs_server_here(demo):
    fs = FileSystem.objects.create(name="turbo", kind=FileSystem.Kind.NFS, source="nfs.example:/export/data")
    job = unsaved(demo, name="tb", pool_type="dedicated", tensorboard=True, observe_file_system=fs)
    attempt, task_run = instance_of(job, demo)
    mount = {m["Target"]: m for m in mounts_for(job, attempt, task_run)}[v.DEFAULT_SUMMARY_PATH]
    assert (mount["Type"], mount["Source"], mount["ReadOnly"]) == (
        "volume",
        f"console-nfs-{job.id.hex[:12]}-summary",
        False,
    )
    assert mount["VolumeOptions"]["DriverConfig"]["Options"] == {
        "type": "nfs",
        "o": f"addr=nfs.example,{v.DEFAULT_NFS_OPTIONS}",
        "device": f":/export/data/summaries/tb-{job.id}",
    }
    assert mount["VolumeOptions"]["Labels"]["console.job"] == str(job.id)  # cleanup.py removes it by label
    assert docker_hosts.container_environment(job, attempt, task_run)["MA_SUMMARY_DIR"] == v.DEFAULT_SUMMARY_PATH


def test_the_job_key_pair_is_made_once_even_by_concurrent_starts(demo):
    job = unsaved(demo, name="pair", node_count=3, mutual_trust=True)
    attempt, task_run = instance_of(job, demo)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            prepare_sources(job, attempt, task_run)
        except BaseException as exc:  # reported below: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    folder = ssh.ssh_dir_path(job)
    assert sorted(p.name for p in folder.iterdir()) == ["authorized_keys", "config", "id_ed25519", "id_ed25519.pub"]
    private = (folder / "id_ed25519").read_bytes()
    prepare_sources(job, attempt, task_run)  # a restart: the same key pair
    assert (folder / "id_ed25519").read_bytes() == private
    key = serialization.load_ssh_private_key(private, password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert (folder / "authorized_keys").read_bytes() == (folder / "id_ed25519.pub").read_bytes()
    assert (folder / "authorized_keys").read_bytes().startswith(public + b" ma-user@pair-")
    modes = {p.name: (p.stat().st_mode & 0o777, p.stat().st_uid, p.stat().st_gid) for p in [folder, *folder.iterdir()]}
    assert modes == {
        str(job.id): (0o700, 1000, 1000),
        "id_ed25519": (0o600, 1000, 1000),
        "id_ed25519.pub": (0o644, 1000, 1000),
        "authorized_keys": (0o600, 1000, 1000),
        "config": (0o644, 1000, 1000),
    }
    config = (folder / "config").read_text()
    for index in range(3):
        assert f"Host pair-worker-{index}\n    HostName pair-worker-{index}\n    User ma-user\n" in config
    assert "Host *\n    IdentityFile /home/ma-user/.ssh/id_ed25519\n    StrictHostKeyChecking no\n" in config


def test_ssh_remote_authorized_keys_follow_the_key_pair(demo):
    key = KeyPair.objects.create(owner=demo.owner, name="laptop", public_key=user_key())
    job = unsaved(demo, name="remote", ssh_remote=True, ssh_key_pair=key)
    attempt, task_run = instance_of(job, demo)
    prepare_sources(job, attempt, task_run)
    authorized = ssh.ssh_dir_path(job) / "authorized_keys"
    assert authorized.read_text() == key.public_key + "\n"
    key.delete()  # SET_NULL: the next start revokes the access, the job still starts
    job.ssh_key_pair_id = None
    prepare_sources(job, attempt, task_run)
    assert authorized.read_text() == ""
    # No user private key: the user's public key, and the host key of the job's own sshd.
    assert sorted(p.name for p in authorized.parent.iterdir()) == [
        "authorized_keys",
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
    ]


# -- real containers -------------------------------------------------------------------------------------------
TRUST_COMMAND = f"""
cd {SSH_DIR} && stat -c '%n %a %u' . id_ed25519 id_ed25519.pub authorized_keys config
sha256sum id_ed25519 authorized_keys
if touch {SSH_DIR}/x 2>/dev/null; then echo ssh-dir-rw; else echo ssh-dir-ro; fi
echo "rank $RANK" > "$MA_SUMMARY_DIR/rank-$RANK.txt" && echo "summary in $MA_SUMMARY_DIR"
echo files-done
until [ -e /job-data/go ]; do sleep 0.1; done
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_instance_gets_the_same_trust_files_and_the_summary_dir(demo, worker, docker_client):
    pool = dedicated_pool(demo)
    fs, root = host_dir("summaries-fs")
    job = unsaved(
        demo,
        name="trust",
        image=BUSYBOX,
        command=TRUST_COMMAND,
        node_count=2,
        pool_type="dedicated",
        pool=pool,
        spec_type="custom",
        custom_cpus=0.5,
        custom_memory_gb=0.25,
        mutual_trust=True,
        tensorboard=True,
        observe_file_system=fs,
    )
    preview = runtime_layout(job)  # what the wizard shows before submitting
    job.full_clean()
    job.save()
    schedule.submit(job)

    runs = running_runs(job, 2)
    for run in runs:
        wait_for(lambda: "files-done" in log_texts(run), message=f"instance {run.index}'s output")
    folder = ssh.ssh_dir_path(job)
    summaries = root / "summaries" / f"trust-{job.id}"
    for run in runs:
        assert log_texts(run) == [
            "[console] TensorBoard: 'tensorboard' is not in this image (the notebook preset image has it)",
            ". 700 1000",
            "id_ed25519 600 1000",
            "id_ed25519.pub 644 1000",
            "authorized_keys 600 1000",
            "config 644 1000",
            f"{sha256(folder / 'id_ed25519')}  id_ed25519",
            f"{sha256(folder / 'authorized_keys')}  authorized_keys",
            "ssh-dir-ro",
            f"summary in {v.DEFAULT_SUMMARY_PATH}",
            "files-done",
        ], run.index
        attrs = docker_client.api.inspect_container(run.container_id)
        mounted = {(m["Destination"], m["RW"]) for m in attrs["Mounts"]}
        assert mounted >= set(engine.CONSOLE_MOUNTS.items())  # the console's tools and control dir
        mounted -= set(engine.CONSOLE_MOUNTS.items())
        assert mounted == {(e.container_path, e.mode == "rw") for e in preview if e.mounted}
        sources = {m["Destination"]: m["Source"] for m in attrs["Mounts"]}
        assert (sources[SSH_DIR], sources[v.DEFAULT_SUMMARY_PATH]) == (str(folder), str(summaries))
    assert (folder / "authorized_keys").read_bytes() == (folder / "id_ed25519.pub").read_bytes()
    for index in (0, 1):
        written = summaries / f"rank-{index}.txt"
        assert written.read_text() == f"rank {index}\n"
        assert written.stat().st_uid == 1000

    (job_data_dir(job) / "go").touch()
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    # Released resources: the private key goes, the summaries stay (they are the user's).
    wait_for(
        lambda: cleanup.release_job_resources(job.id) or TrainingJob.objects.get(id=job.id).resources_released_at,
        message="the job's resources to be released",
    )
    assert not folder.exists()
    assert sorted(p.name for p in summaries.iterdir()) == ["rank-0.txt", "rank-1.txt"]


REMOTE_COMMAND = f"""
cd {SSH_DIR} && ls -A && stat -c '%n %a %u' authorized_keys && cat authorized_keys
echo "MA_JUPYTER_LAB=$MA_JUPYTER_LAB"
"""


def test_ssh_remote_development_puts_the_users_key_in_authorized_keys(demo, worker):
    key = KeyPair.objects.create(owner=demo.owner, name="laptop", public_key=user_key())
    job = submit_job(demo, name="remote", command=REMOTE_COMMAND, ssh_remote=True, ssh_key_pair=key, jupyter_lab=True)
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    lines = log_texts(job.attempts.get().task_runs.get())  # the persisted log
    assert job.phase == Phase.COMPLETED, (job.phase_reason, lines)
    assert lines == [
        # The launcher says what it could not start in this image (busybox): hints, not facts.
        "[console] JupyterLab: 'jupyter' is not in this image (the notebook preset image has it)",
        "[console] SSH remote development: '/usr/sbin/sshd' is not in this image "
        "(the python and notebook preset images have it)",
        "authorized_keys",
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
        "authorized_keys 600 1000",
        key.public_key,
        "MA_JUPYTER_LAB=1",
    ]
