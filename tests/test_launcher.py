"""The container launcher's environment checks (SPEC §5) and its reports, run in a real
busybox container the way the console runs it: as root, on the console's own busybox
(/.console/bin), with a control dir the job cannot write. The GPU case is real too: this
machine has no GPU, so gpu-check must fail."""

import os
import stat
import tempfile
import threading
import time
import uuid
from pathlib import Path

import docker
import pytest

from faulttolerance.launcher import LAUNCHER
from jobs.runtime import control as control_files
from jobs.runtime import engine
from tests.helpers import BUSYBOX
from tests.pytest_env import TEST_LABEL, TMP

LOW = {"MA_CHECK_ROOT_GB": "0.1", "MA_CHECK_SHM_GB": "0.5", "MA_CHECK_CACHE_GB": "0.1"}


def run_launcher(docker_client, env: dict, **kwargs) -> tuple[int, list[str]]:
    container = start_launcher(docker_client, env, **kwargs)
    try:
        code = container.wait(timeout=30)["StatusCode"]
        return code, container.logs().decode().splitlines()
    finally:
        container.remove(force=True)


def start_launcher(
    docker_client, env: dict, *, control: Path | None = None, image: str = BUSYBOX, extra_mounts=(), **kwargs
):
    control = control or Path(tempfile.mkdtemp(dir=TMP, prefix="control-"))
    control.chmod(0o755)
    return docker_client.containers.run(
        image,
        [engine.BUSYBOX, "sh", "-c", LAUNCHER, "launcher"],
        environment={
            "MA_ENV_CHECKS": "1",
            "MA_USER_COMMAND": "echo user command ran",
            "MA_ATTEMPT": "1",
            **LOW,
            **env,
        },
        user="0:0",
        network_mode="none",
        shm_size="1g",
        tmpfs={"/etc/volcano": "mode=755,size=64k", "/cache": "size=256m"},
        mounts=[
            docker.types.Mount(engine.TOOLS_MOUNT, str(engine.runtime_tools_dir()), type="bind", read_only=True),
            docker.types.Mount(engine.CONTROL_MOUNT, str(control), type="bind"),
            *extra_mounts,
        ],
        security_opt=["no-new-privileges"],
        labels=dict([TEST_LABEL]),
        detach=True,
        **kwargs,
    )


@pytest.fixture(scope="module")
def client(docker_client):
    return docker_client


def items(lines: list[str]) -> list[str]:
    return [line.split(", result: ")[0].removeprefix("[env-check] item: ") for line in lines if "item:" in line]


def test_all_checks_pass_and_the_command_runs(client):
    code, lines = run_launcher(
        client,
        {"MA_JOB_NAME": "j", "MA_VOLCANO_HOSTS": "j-worker-0"},
        hostname="j-worker-0",
        extra_hosts={"j-worker-0": "127.0.0.1"},  # the instance's own name, as the console's hosts file has it
    )
    assert code == 0
    assert items(lines) == ["dns", "disk-size root", "disk-size shm", "disk-size cache"]
    assert all("result: pass" in line for line in lines if "item:" in line)
    assert lines[-1] == "user command ran"


def test_unresolvable_instance_name_fails_dns(client):
    code, lines = run_launcher(
        client,
        # The check waits for names to resolve (instances start one after the other): 1 s here.
        {"MA_JOB_NAME": "j", "MA_VOLCANO_HOSTS": "j-worker-0 nowhere-worker-9", "MA_CHECK_DNS_WAIT_S": "1"},
        extra_hosts={"j-worker-0": "127.0.0.1"},
    )
    assert code == 86
    assert "[env-check] item: dns, result: fail, host name nowhere-worker-9 does not resolve" in lines[-2]
    assert lines[-1] == "[env-check] error,exiting"
    assert "user command ran" not in lines


def test_a_stop_during_the_checks_ends_the_container_at_once(client):
    """PID 1 ignores a signal it has no handler for: without one, docker stop's SIGTERM during
    the checks (the dns check waits up to 30 s for the other instances' names) was ignored until
    Docker's SIGKILL, its timeout later (137). The launcher ends on it (143) as soon as the check
    in hand returns."""
    container = start_launcher(client, {"MA_VOLCANO_HOSTS": "peer-that-never-comes", "MA_CHECK_DNS_WAIT_S": "120"})
    try:
        time.sleep(1)  # its preamble takes milliseconds: then it waits in the dns check (it prints at its end)
        container.reload()
        assert container.status == "running" and "[env-check]" not in container.logs().decode()
        container.stop(timeout=20)  # Docker's SIGKILL only after 20 s: the exit code tells which ended it
        container.reload()
        assert container.attrs["State"]["ExitCode"] == 143
        assert "user command ran" not in container.logs().decode()
    finally:
        container.remove(force=True)


def test_too_little_disk_fails_with_the_threshold_named(client):
    control = Path(tempfile.mkdtemp(dir=TMP, prefix="control-"))
    code, lines = run_launcher(client, {"MA_CHECK_CACHE_GB": "100000"}, control=control)
    assert code == 86
    assert "item: disk-size cache, result: fail" in lines[-2] and "needs more than 100000 GB" in lines[-2]
    # The verdict the console trusts is the report in the control dir, not the log.
    report = (control / "env-check").read_text()
    assert report.startswith("fail disk-size cache: /cache has") and "needs more than 100000 GB" in report
    assert not (control / "exit-1").exists()  # the user's command never ran


def test_small_shm_fails(client):
    code, lines = run_launcher(
        client,
        {"MA_CHECK_SHM_GB": "1"},
    )
    assert code == 86
    assert "item: disk-size shm, result: fail" in lines[-2]


def test_ulimit_check_runs_for_ib_flavors_and_fails_below_the_thresholds(client):
    env = {
        "MA_CHECK_ULIMIT": "1",
        "MA_CHECK_ULIMIT_MEMLOCK": "16000",
        "MA_CHECK_ULIMIT_NOFILE": "1000000",
        "MA_CHECK_ULIMIT_STACK": "8000",
        "MA_CHECK_ULIMIT_NPROC": "1000000",
    }
    code, lines = run_launcher(client, env, ulimits=[docker.types.Ulimit(name="memlock", soft=8192, hard=8192)])
    assert code == 86
    assert "item: ulimit, result: fail, max locked memory is" in lines[-2]
    # This sandbox cannot raise limits past its own (memlock 8192): a pool whose
    # thresholds sit below them passes.
    lower = {**env, "MA_CHECK_ULIMIT_MEMLOCK": "4096", "MA_CHECK_ULIMIT_NOFILE": "1000", "MA_CHECK_ULIMIT_NPROC": "100"}
    code, lines = run_launcher(client, lower)
    assert code == 0, lines
    assert "[env-check] item: ulimit, result: pass, limits above the thresholds" in lines


def test_gpu_check_fails_on_a_host_without_gpus(client):
    code, lines = run_launcher(client, {"MA_CHECK_GPU": "1"})
    assert code == 86
    assert "[env-check] item: gpu-check, result: fail, no GPU is visible in the container" in lines


def test_no_checks_without_fault_tolerance(client):
    code, lines = run_launcher(client, {"MA_ENV_CHECKS": "0", "MA_CHECK_CACHE_GB": "100000"})
    assert (code, lines) == (0, ["user command ran"])


def test_the_command_runs_as_ma_user_without_capabilities_and_its_exit_is_reported(client):
    control = Path(tempfile.mkdtemp(dir=TMP, prefix="control-"))
    command = "id -u; id -g; grep CapEff /proc/self/status; echo $HOME; exit 3"
    code, lines = run_launcher(client, {"MA_USER_COMMAND": command, "HOME": "/home/ma-user"}, control=control)
    assert code == 3
    user_lines = [line for line in lines if not line.startswith("[env-check]")]
    assert user_lines[:3] == ["1000", "1000", "CapEff:\t0000000000000000"]
    assert (control / "env-check").read_text().strip() == "pass"
    assert (control / "exit-1").read_text().strip() == "3 0"


def test_a_hostile_command_cannot_forge_the_reports_or_stop_the_launcher(client):
    """The job prints the launcher's lines, tries to write the control dir, to replace the
    console's busybox and to signal PID 1; the reports say what really happened."""
    control = Path(tempfile.mkdtemp(dir=TMP, prefix="control-"))
    command = (
        "echo '[console] process exited with code 0; waiting for the supervisor decision'; "
        "echo '[env-check] error,exiting'; "
        "echo 'fail dns: forged' > /.console/run/env-check || echo cannot-write-report; "
        "echo '0 0' > /.console/run/exit-1 || echo cannot-write-exit; "
        "echo 'restart 9' > /.console/run/decision || echo cannot-write-decision; "
        "cp /bin/sh /.console/bin/busybox 2>/dev/null || echo cannot-replace-tools; "
        "kill -TERM 1 2>/dev/null || echo cannot-signal-launcher; "
        "exit 5"
    )
    code, lines = run_launcher(client, {"MA_USER_COMMAND": command}, control=control)
    assert code == 5
    for refused in ("cannot-write-report", "cannot-write-exit", "cannot-write-decision", "cannot-replace-tools"):
        assert refused in lines
    assert "cannot-signal-launcher" in lines
    assert (control / "env-check").read_text().strip() == "pass"
    assert (control / "exit-1").read_text().strip() == "5 0"
    assert not (control / "decision").exists()


def hostile_image(client, tag: str, links: dict[str, str], base: str = BUSYBOX) -> str:
    """An image with symbolic links at the given paths (path -> target), built from a tar
    layer (no RUN: nothing runs while building)."""
    import io
    import tarfile

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for path, target in links.items():
            entry = tarfile.TarInfo(path.lstrip("/"))
            entry.type, entry.linkname = tarfile.SYMTYPE, target
            tar.addfile(entry)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", f"FROM {base}\nADD links.tar /\n".encode()), ("links.tar", layer.getvalue())):
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, network_mode="none")
    return tag


@pytest.mark.parametrize(
    "links",
    [
        {"/cache": "/.console/run"},  # chown of /cache would hand the control dir to the job
        {"/.console": "/home/ma-user/x"},  # the job could rename the tools' folder and plant its own
        {"/etc/volcano": "/tmp/v"},
    ],
    ids=["cache-to-control-dir", "console-into-home", "volcano-to-tmp"],
)
def test_an_image_with_links_at_the_consoles_mounts_is_refused(client, links):
    tag = f"console-test/hostile-{abs(hash(tuple(links.items())))}:latest"
    hostile_image(client, tag, links)
    control = Path(tempfile.mkdtemp(dir=TMP, prefix="control-"))
    try:
        code, lines = run_launcher(client, {"MA_USER_COMMAND": "echo user command ran"}, control=control, image=tag)
    finally:
        client.images.remove(tag, force=True)
    assert code == 87, lines
    assert any(line.startswith("[console] refused: the image has a link at /.console") for line in lines), lines
    assert "user command ran" not in lines
    assert sorted(p.name for p in control.iterdir()) == []  # no report: nothing ran
    assert (control.stat().st_uid, oct(control.stat().st_mode & 0o777)) == (0, "0o755")


def test_a_mount_of_the_job_that_covers_the_control_dir_through_a_planted_link_is_refused(client):
    """A job writes a link into a folder it has mounted (/data/x -> /.console); its next container
    mounts another of its folders at /data/x/run. Docker mounts by depth and follows the link
    inside the container: that folder, the job's to write, would cover the control dir, where the
    launcher reads its go and its decisions and writes its reports."""
    outer = Path(tempfile.mkdtemp(dir=TMP, prefix="outer-"))
    inner = Path(tempfile.mkdtemp(dir=TMP, prefix="inner-"))
    (outer / "x").symlink_to("/.console")
    (inner / "go").write_text("forged\n")
    control = Path(tempfile.mkdtemp(dir=TMP, prefix="control-"))
    code, lines = run_launcher(
        client,
        {"MA_USER_COMMAND": "echo user command ran"},
        control=control,
        extra_mounts=[
            docker.types.Mount("/data", str(outer), type="bind"),
            docker.types.Mount("/data/x/run", str(inner), type="bind"),
        ],
    )
    assert code == 87, lines
    assert "[console] refused: a mount of the job covers the console's tools or control dir" in lines, lines
    assert "user command ran" not in lines


def test_the_command_runs_in_the_images_own_shell(client):
    from tests.helpers import PYTHON_IMAGE

    code, lines = run_launcher(
        client,
        {"MA_ENV_CHECKS": "0", "MA_USER_COMMAND": "readlink /proc/$$/exe; ls --version | head -1"},
        image=PYTHON_IMAGE,
    )
    assert code == 0, lines
    assert lines[0] == "/usr/bin/dash" and "GNU coreutils" in lines[1], lines


def test_a_process_restart_ends_what_the_previous_run_left_running(client):
    """Run 1 leaves a daemon and fails; the decision restarts it in place: run 2 finds it gone."""
    control = Path(tempfile.mkdtemp(dir=TMP, prefix="control-"))
    command = (
        'if [ "$MA_ATTEMPT" = 1 ]; then sleep 1000 & echo $! > /tmp/daemon; exit 1; fi; '
        'if kill -0 "$(cat /tmp/daemon)" 2>/dev/null; then echo daemon-alive; else echo daemon-gone; fi'
    )

    def decide() -> None:  # as the console does once run 1 reported its exit
        deadline = time.monotonic() + 20
        while not (control / "exit-1").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (control / "decision.new").write_text("restart 2\n")
        (control / "decision.new").rename(control / "decision")

    threading.Thread(target=decide, daemon=True).start()
    code, lines = run_launcher(
        client, {"MA_ENV_CHECKS": "0", "MA_PROCESS_RESTART": "1", "MA_USER_COMMAND": command}, control=control
    )
    assert code == 0, lines
    assert "daemon-gone" in lines and "daemon-alive" not in lines
    assert (control / "exit-1").read_text().strip() == "1 0"
    assert (control / "exit-2").read_text().strip() == "0 0"


def test_the_wake_fifo_ends_the_wait_is_held_only_while_waiting_and_the_job_cannot_open_it(client):
    """The console wakes a launcher waiting for a decision through the control dir's FIFO
    (control.wake). With the launcher's own poll made 120 s, only the wake can bring the restart
    within the 30 s the run is given. No run inherits the FIFO, and the job cannot open it."""
    job_id, name = uuid.uuid4(), "tj-wake-a1-w0"
    control = engine.make_control_dir(job_id, name)
    command = (
        'if [ "$MA_ATTEMPT" = 1 ]; then exit 1; fi; '
        "[ -e /proc/self/fd/3 ] && echo has-fd-3 || echo no-fd-3; "
        "(exec 4<>/.console/run/wake) 2>/dev/null && echo opened-wake || echo cannot-open-wake"
    )
    seen = {}

    def decide() -> None:  # as the console does, once the launcher waits (holds the FIFO)
        deadline = time.monotonic() + 20
        while not control_files.wake(job_id, name) and time.monotonic() < deadline:
            time.sleep(0.02)  # False until a reader holds it
        info = os.stat(control / "wake")
        seen.update(fifo=stat.S_ISFIFO(info.st_mode), owner=info.st_uid, mode=oct(info.st_mode & 0o777))
        engine.write_control_file(job_id, name, "decision", "restart 2\n")
        seen["woken"] = control_files.wake(job_id, name)

    threading.Thread(target=decide, daemon=True).start()
    env = {"MA_ENV_CHECKS": "0", "MA_PROCESS_RESTART": "1", "MA_DECISION_POLL_S": "120", "MA_USER_COMMAND": command}
    code, lines = run_launcher(client, env, control=control)
    assert code == 0, lines
    assert seen == {"fifo": True, "owner": os.geteuid(), "mode": "0o600", "woken": True}, seen
    assert "no-fd-3" in lines and "cannot-open-wake" in lines, lines
    assert (control / "exit-2").read_text().strip() == "0 0"


def test_the_hosts_file_a_job_reads_is_readable_whatever_the_consoles_umask(tmp_path, settings):
    """Unit: a single instance's /etc/hosts comes from its control dir (docker_hosts.HOSTS_FILE),
    read by the job's uid 1000: 0644 even under a worker's umask of 077."""
    settings.CONTROL_ROOT = str(tmp_path)
    job_id = uuid.uuid4()
    folder = control_files.make_control_dir(job_id, "c")
    previous = os.umask(0o077)
    try:
        control_files.write_control_file(job_id, "c", "hosts", "127.0.0.1\tlocalhost\n", mode=0o644)
        control_files.write_control_file(job_id, "c", "go", "1\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(folder / "hosts").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(folder / "go").st_mode) == 0o600  # the others as before: the launcher's


def test_the_wake_writes_only_into_a_fifo_of_the_control_dir_that_a_launcher_holds(tmp_path, settings):
    """Unit: never a link (followed nowhere), never a plain file, never a FIFO no one reads (it
    would block a writer that waited)."""
    settings.CONTROL_ROOT = str(tmp_path)
    job_id = uuid.uuid4()
    folder = control_files.make_control_dir(job_id, "c")
    assert control_files.wake(job_id, "c") is False  # made, but no launcher reads it
    reader = os.open(folder / "wake", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert control_files.wake(job_id, "c") is True
        assert os.read(reader, 8) == b"w"
    finally:
        os.close(reader)
    os.unlink(folder / "wake")
    (folder / "wake").write_text("kept")
    assert control_files.wake(job_id, "c") is False and (folder / "wake").read_text() == "kept"
    os.unlink(folder / "wake")
    elsewhere = tmp_path / "elsewhere"
    os.mkfifo(elsewhere)
    (folder / "wake").symlink_to(elsewhere)
    reader = os.open(elsewhere, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert control_files.wake(job_id, "c") is False  # a link: not followed
        assert os.read(reader, 8) == b""
    finally:
        os.close(reader)


def test_a_job_flooding_the_launcher_with_orphans_cannot_hold_its_wait_past_the_deadline(client):
    """Hostile: the failed run leaves a daemon that makes short-lived orphans without end (each
    reparented to the launcher, a SIGCHLD each). ash restarts a `read -t` on every signal it has
    no trap for: without the launcher's CHLD trap one 50 ms read lasted minutes. No decision
    comes; the launcher gives up at its deadline and the container ends with the run's code."""
    storm = "(while :; do (sleep 0.01 &); sleep 0.01; done) & exit 4"
    env = {"MA_ENV_CHECKS": "0", "MA_PROCESS_RESTART": "1", "MA_DECISION_TIMEOUT_S": "2", "MA_USER_COMMAND": storm}
    code, lines = run_launcher(client, env)
    assert code == 4, lines
    assert "[console] process exited with code 4; waiting for the supervisor's decision" in lines
