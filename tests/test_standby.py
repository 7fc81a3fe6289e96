"""The standby container (jobs/runtime/standby.py): the next attempt's container, made while the
job runs, so that a container-level restart is a start. Real Docker, PostgreSQL and worker."""

from __future__ import annotations

import os
import time
from pathlib import Path

import docker
import pytest

from jobs.models import Attempt, Phase, TaskRun
from jobs.runtime import cleanup, docker_hosts, engine, staging, standby, stop
from tests.folders import host_dir
from tests.helpers import BUSYBOX, build_image, dedicated_pool, ended, log_texts, submit_job, unsaved, wait_for
from tests.pytest_env import TEST_LABEL, TMP

pytestmark = pytest.mark.django_db(transaction=True)

LOOP = "echo attempt $MA_ATTEMPT; while true; do sleep 0.2; done"


def created_standby(docker_client, job, number: int, *, armed: bool = True):
    """Attempt `number`'s standby, once it exists: armed (started, its launcher waiting for its
    go: standby.arm) or, with armed=False, made and not started."""
    name = docker_hosts.container_name(job, number, 0)

    def found():
        # Sparse: a listed container removed before its inspect would raise instead of retrying.
        listed = docker_client.containers.list(all=True, sparse=True, filters={"name": f"^{name}$"})
        if not listed or listed[0].attrs.get("State") != ("running" if armed else "created"):
            return None
        try:
            return docker_client.containers.get(listed[0].id)
        except docker.errors.NotFound:
            # Docker lists a container being created before it can be inspected (its create
            # writes the listing's view, then registers it): the standby's create is still in
            # flight. Two full runs and a stress run (2 in 120) failed here with a 404 while
            # no one had removed anything.
            return None

    try:
        return wait_for(found, timeout=30, message=f"the standby {name} ({'armed' if armed else 'made'})")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{what_the_job_went_through(job)}") from None


def what_the_job_went_through(job) -> str:
    """The job's rows and every worker log line naming it, for a failure's reader. Read after a
    pause: the worker logs a removal after Docker answered it, the test may see the removal first."""
    time.sleep(2)
    job.refresh_from_db()
    said = [f"job: {job.phase} {job.phase_reason!r} terminate_requested={job.terminate_requested}"]
    for attempt in job.attempts.order_by("number"):
        said.append(f"attempt {attempt.number}: {attempt.state} level={attempt.level}")
        for run in attempt.task_runs.all():
            said.append(f"  run {run.container_name} {run.state} exit={run.exit_code} error={run.error!r}")
    said += [f"event: {e.kind} {e.message}" for e in job.events.order_by("id")]
    for log in sorted(Path(TMP).glob("celery-worker*.log")):  # a test's second worker too
        lines = log.read_text(errors="replace").splitlines()
        said += [f"{log.name}: {line}" for line in lines if job.id.hex in line or str(job.id) in line]
    return "\n".join(said)[-6000:]


def job_containers(docker_client, job) -> list:
    return docker_client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job.id}"})


def running_with_standby(demo, docker_client, name: str, **fields):
    """A fault-tolerant job whose attempt 1 runs and whose attempt-2 standby is armed."""
    fields = {"fault_tolerance": True, "max_restarts": 3, "command": LOOP, **fields}
    job = submit_job(demo, name=name, **fields)
    first = wait_for(lambda: job.attempts.filter(number=1, state=Attempt.State.RUNNING).first(), message="attempt 1")
    return job, first, created_standby(docker_client, job, 2)


def restart_of(job, first: Attempt, waiting) -> tuple[Attempt, TaskRun]:
    """Attempt 2 and its task run as a container-level restart makes them (not saved)."""
    attempt = Attempt(job=job, number=2, level="container")
    host = first.task_runs.get().host
    return attempt, TaskRun(attempt=attempt, index=0, host=host, container_name=standby.name_of(waiting))


def terminated(job) -> None:
    stop.request_terminate(job.id)
    wait_for(lambda: ended(job), message="Terminated")


def two_mount_job(demo, docker_client, name: str, command: str):
    """A fault-tolerant job on a file system it writes, mounted twice: its root at /mnt/s and its
    folder /team/data at /mnt/data. Its attempt 1 waits for the file `go` (touched by the test
    once the standby is armed) before it acts on /mnt/s. Returns the job, attempt 1, the armed
    standby and the file system's folder on the host."""
    from jobs.runtime import schedule

    fs, folder = host_dir(name)
    (folder / "team" / "data").mkdir(parents=True, exist_ok=True)
    for path in (folder, folder / "team", folder / "team" / "data"):
        os.chown(path, 1000, 1000)
    job = unsaved(
        demo,
        name=name,
        pool_type="dedicated",
        pool=dedicated_pool(demo),
        spec_type="custom",
        custom_cpus=0.5,
        custom_memory_gb=0.25,
        fault_tolerance=True,
        max_restarts=2,
        command=f'if [ "$MA_ATTEMPT" = 1 ]; then while [ ! -e /mnt/s/go ]; do sleep 0.1; done; {command}',
        file_system_mounts=[
            {"file_system": fs.name, "path": "/", "mount_path": "/mnt/s", "read_only": False},
            {"file_system": fs.name, "path": "/team/data", "mount_path": "/mnt/data", "read_only": False},
        ],
    )
    job.full_clean()
    job.save()
    schedule.submit(job)
    first = wait_for(lambda: job.attempts.filter(number=1, state=Attempt.State.RUNNING).first(), message="attempt 1")
    return job, first, created_standby(docker_client, job, 2), folder


def test_a_container_level_restart_starts_the_standby_and_the_end_removes_the_next_one(demo, worker, docker_client):
    job, first, waiting = running_with_standby(demo, docker_client, "standby")
    assert waiting.labels["console.attempt"] == "2" and waiting.labels[docker_hosts.STANDBY_LABEL] == "1"
    assert "MA_ATTEMPT=2" in waiting.attrs["Config"]["Env"] and "MA_STANDBY=1" in waiting.attrs["Config"]["Env"]

    running = docker_client.containers.get(first.task_runs.get().container_id)
    wait_for(lambda: first.task_runs.get().log_lines >= 1, message="attempt 1's first line")
    running.kill()  # SIGKILL from outside: restarted at container level, on the same host

    second = wait_for(lambda: job.attempts.filter(number=2, state=Attempt.State.RUNNING).first(), message="attempt 2")
    assert second.task_runs.get().container_id == waiting.id  # the armed standby went on, no new container

    wait_for(lambda: "attempt 2" in log_texts(second.task_runs.get()), message="its line")
    created_standby(docker_client, job, 3)  # and the one after it is made while attempt 2 runs

    terminated(job)
    wait_for(lambda: not job_containers(docker_client, job), message="every container of the job removed")


def test_a_link_planted_in_a_mount_while_the_job_ran_is_never_followed_by_its_standby(demo, worker, docker_client):
    """Docker resolves a bind source when it starts a container, not when it creates it: a job that
    writes a file system replaces the folder of its own second mount by a link to the host's /
    after its standby was made. The restart must not start that standby."""
    plant = (
        "rm -rf /mnt/s/team/data && ln -s / /mnt/s/team/data && echo planted; fi; "
        "ls /mnt/data/etc/hostname && echo ESCAPED; while true; do sleep 0.2; done"
    )
    job, first, waiting, folder = two_mount_job(demo, docker_client, "standby-planted", plant)
    (folder / "go").touch()
    wait_for(lambda: (folder / "team" / "data").is_symlink(), message="the planted link")
    docker_client.containers.get(first.task_runs.get().container_id).kill()

    wait_for(lambda: ended(job), timeout=60, message="the restart to be refused")
    assert job.phase == Phase.FAILED and "is a symbolic link" in job.phase_reason, job.phase_reason
    restart = job.attempts.get(number=2).task_runs.get()
    assert restart.state == TaskRun.State.START_FAILED and not restart.container_id
    assert not docker_client.containers.list(all=True, filters={"id": waiting.id})  # removed, never given its go
    wait_for(lambda: not job_containers(docker_client, job), message="every container of the job removed")


def test_the_orphan_scan_keeps_a_running_jobs_standby_and_removes_one_no_attempt_will_take(demo, worker, docker_client):
    job, _, waiting = running_with_standby(demo, docker_client, "kept")
    cleanup.remove_orphaned_containers()
    waiting.reload()
    assert waiting.status == "running" and standby.is_standby(waiting)  # attempt 2 may come: kept

    # Attempt 2 came without it (a process-level restart keeps the old container): it is stale.
    # (Made here without a start; the running attempt is left as it is.)
    Attempt.objects.create(job=job, number=2, level="process", state=Attempt.State.ENDED)
    assert standby.is_standby(docker_client.containers.get(waiting.id))
    # The scan removes it: this call's, or the worker's own reconcile round if it came first
    # (it runs the same scan every 2 s here; a full run saw it win).
    cleanup.remove_orphaned_containers()
    wait_for(lambda: not docker_client.containers.list(all=True, filters={"id": waiting.id}), message="removed")
    terminated(job)


def test_no_standby_for_a_job_without_fault_tolerance(demo, worker, docker_client):
    plain = submit_job(demo, name="plain", command=LOOP)
    wait_for(lambda: plain.attempts.filter(number=1, state=Attempt.State.RUNNING).exists(), message="attempt 1")
    attempt = plain.attempts.get(number=1)
    assert standby.prepare(attempt.id) is False  # R = 0: nothing would ever start it
    names = [standby.name_of(c) for c in job_containers(docker_client, plain)]
    assert names == [plain.attempts.get().task_runs.get().container_name]
    terminated(plain)


def test_a_key_pair_deleted_while_the_job_ran_gives_no_access_through_its_standby(demo, worker, docker_client):
    """The SSH files were staged with the standby, the user's key still in authorized_keys; the
    user deletes the key pair; the take-over, right before the standby's start, writes them again.
    (Called here directly: a real restart would also make the next standby, which rewrites them.)"""
    from jobs.models import KeyPair, TrainingJob
    from jobs.runtime import ssh
    from tests.helpers import PYTHON_IMAGE

    _, public = ssh.generate_key_pair("owner@laptop")
    pair = KeyPair.objects.create(owner=demo.owner, name="laptop", public_key=public.decode().strip())
    job, first, waiting = running_with_standby(
        demo, docker_client, "remote", image=PYTHON_IMAGE, ssh_remote=True, ssh_key_pair=pair, max_restarts=2
    )
    authorized = ssh.ssh_dir_path(job) / "authorized_keys"
    assert authorized.read_text().strip() == pair.public_key
    pair.delete()

    job = TrainingJob.objects.get(id=job.id)
    next_attempt, next_run = restart_of(job, first, waiting)
    assert standby.take_over(job, next_attempt, next_run, waiting)  # the same spec: it may start
    assert authorized.read_text() == ""  # but the access went with the key pair
    waiting.remove(force=True)  # given its go, it is the restart's container: this one is not coming
    terminated(job)


def test_a_restart_committed_while_the_orphan_scan_reads_keeps_its_standby(demo, worker, docker_client, monkeypatch):
    """Injected race (a full run lost a restart to it): the restart's next attempt and its task
    run are committed while the scan reads, right before it reads the jobs. The scan must see
    the run that will start the standby and keep it."""
    job, first, waiting = running_with_standby(demo, docker_client, "race")
    _, restart_run = restart_of(job, first, waiting)
    jobs = cleanup.TrainingJob

    class RestartCommitsNow:  # the scan's query of the jobs, with the restart's commit just before it
        class objects:
            @staticmethod
            def filter(*args, **kwargs):
                if not job.attempts.filter(number=2).exists():
                    # ENDED: made here without a start, so that reconcile does not start it.
                    restart_run.attempt.state = Attempt.State.ENDED
                    restart_run.attempt.save()
                    restart_run.save()
                return jobs.objects.filter(*args, **kwargs)

    monkeypatch.setattr(cleanup, "TrainingJob", RestartCommitsNow)
    cleanup.remove_orphaned_containers()
    assert docker_client.containers.list(all=True, filters={"id": waiting.id}), "the standby its restart was starting"
    monkeypatch.undo()
    terminated(job)


def test_a_standby_removed_between_its_check_and_its_start_is_made_again(demo, worker, docker_client, monkeypatch):
    """Injected: the standby goes after the take-over passed it and before Docker's start (no rule
    should remove it then; a restart must not fail if one does). The start creates it afresh."""
    from jobs.runtime import start

    job, first, armed = running_with_standby(demo, docker_client, "gone")
    # One that is not armed (arming failed, or a standby from before arming): made again, not started.
    standby.remove_quietly(armed, "the test wants one that was not armed")
    assert standby.prepare(first.id)
    waiting = created_standby(docker_client, job, 2, armed=False)
    next_attempt, next_run = restart_of(job, first, waiting)
    take_over = standby.take_over

    def passed_then_removed(job, attempt, task_run, container):
        may = take_over(job, attempt, task_run, container)
        if container.id == waiting.id:
            engine.remove_container(container)
        return may

    monkeypatch.setattr(standby, "take_over", passed_then_removed)
    made = start._create_and_start(job, next_attempt, next_run, [next_run.host])
    try:
        assert made.id != waiting.id and made.status == "running"
    finally:
        made.remove(force=True)
    monkeypatch.undo()
    terminated(job)


def test_a_restart_that_finds_its_standby_still_being_made_keeps_its_go(demo, worker, docker_client, monkeypatch):
    """Injected (a full run lost a restart to it): the restart finds the standby right after
    Docker's create and before its prepare marked it. The mark clears what an earlier container
    of the name left, a go included: written first, the restart's go was erased, its running
    container looked like a standby again, and the console removed it. The take-over waits for
    the mark; the go stays."""
    import threading

    job, first, armed = running_with_standby(demo, docker_client, "making")
    standby.remove_quietly(armed, "the test makes the next one itself")
    next_attempt, next_run = restart_of(job, first, armed)
    mark = docker_hosts._mark_standby
    held = []
    monkeypatch.setattr(docker_hosts, "_mark_standby", lambda *args: held.append(args))
    made = docker_hosts.create_container(job, next_attempt, next_run, [next_run.host], standby=True)
    monkeypatch.undo()
    late = threading.Timer(0.5, lambda: mark(*held[0]))  # the prepare, slow to mark it
    late.start()
    try:
        assert standby.take_over(job, next_attempt, next_run, docker_client.containers.get(made.id))
        late.join()
        assert engine.read_control_file(job.id, next_run.container_name, standby.GO) is not None, "the go erased"
        assert not standby.is_standby(docker_client.containers.get(made.id))
    finally:
        late.join()
        made.remove(force=True)
    terminated(job)


def test_a_standby_not_armed_is_started_by_its_restart_with_its_go_already_there(demo, worker, docker_client, settings):
    """CONSOLE_STANDBY_ARMED=0 (or an arm that failed): the standby is only made, and the restart's
    take-over writes its go before Docker's start, so its launcher goes straight on."""
    from jobs.runtime import start

    job, first, armed = running_with_standby(demo, docker_client, "made-only")
    standby.remove_quietly(armed, "the test wants one that was only made")
    assert standby.prepare(first.id)
    settings.STANDBY_ARMED = False
    assert not standby.arm(first.id)  # off: left as made
    waiting = created_standby(docker_client, job, 2, armed=False)
    next_attempt, next_run = restart_of(job, first, waiting)
    made = start._create_and_start(job, next_attempt, next_run, [next_run.host])
    try:
        assert made.id == waiting.id and made.status == "running"
        wait_for(lambda: "attempt 2" in made.logs().decode(errors="replace"), message="the job, right away")
    finally:
        made.remove(force=True)
    terminated(job)


def test_an_armed_standby_runs_nothing_until_its_take_over_says_go(demo, worker, docker_client):
    """Armed by the worker while attempt 1 runs: its launcher reported its mounts and waits; not
    even the environment checks run before the restart's take-over wrote its go."""
    job, first, waiting = running_with_standby(demo, docker_client, "armed")
    name = standby.name_of(waiting)
    assert standby.is_standby(waiting)
    time.sleep(1)
    assert waiting.logs() == b""  # nothing printed: no check, no line of the job
    assert engine.read_control_file(job.id, name, "env-check") is None
    assert len(waiting.top()["Processes"]) == 1  # the launcher alone
    cleanup.remove_orphaned_containers()  # attempt 2 may still come: kept
    waiting.reload()
    assert waiting.status == "running"

    next_attempt, next_run = restart_of(job, first, waiting)
    assert standby.take_over(job, next_attempt, next_run, waiting)
    wait_for(lambda: "attempt 2" in waiting.logs().decode(errors="replace"), message="the job, after its go")
    assert engine.read_control_file(job.id, name, "env-check") == "pass\n"  # the checks ran after the go
    assert not standby.is_standby(waiting)  # its attempt's container now, whatever its labels say
    waiting.remove(force=True)  # the restart this stands for is not coming
    terminated(job)


def test_an_armed_standby_of_a_death_that_takes_no_restart_is_removed_having_run_nothing(demo, worker, docker_client):
    """Hostile: the job prints a traceback and is then killed from outside; the log rule makes it a
    user error, so no restart comes. Its armed standby never ran the job, and it is removed."""
    command = (
        'echo "attempt $MA_ATTEMPT"; touch "$MA_JOB_DATA_DIR/ran-$MA_ATTEMPT"; '
        'echo "Traceback (most recent call last):"; while true; do sleep 0.2; done'
    )
    job, first, waiting = running_with_standby(demo, docker_client, "no-restart", command=command)
    data = staging.job_data_path(job)
    wait_for(lambda: (data / "ran-1").exists(), message="attempt 1's mark")
    docker_client.containers.get(first.task_runs.get().container_id).kill()

    wait_for(lambda: ended(job), timeout=60, message="the job to fail")
    assert job.phase == Phase.FAILED and not job.attempts.filter(number=2).exists(), job.phase_reason
    wait_for(lambda: not job_containers(docker_client, job), message="every container of the job removed")
    assert not (data / "ran-2").exists()  # the standby ran nothing of the job


@pytest.mark.parametrize("swapped", [True, False], ids=["folder-swapped", "folder-kept"])
def test_a_source_folder_replaced_while_the_job_ran_is_what_the_restart_mounts(demo, worker, docker_client, swapped):
    """Hostile (or just untidy): the job renames the folder of its own second mount away and makes
    a new one in its place after its standby was armed, which holds the old folder. The restarted
    job must see the folder now at that path, so the take-over refuses the standby. (Kept as it
    was, the same mounts, and the armed standby is the restart's container.)"""

    change = (
        "mv /mnt/s/team/data /mnt/s/team/old-$$ && mkdir /mnt/s/team/data && echo new >/mnt/s/team/data/which"
        if swapped
        else "echo new >/mnt/s/team/data/which"
    )
    swap = (
        f"{change} && echo changed; fi; echo attempt $MA_ATTEMPT sees $(cat /mnt/data/which 2>/dev/null || echo old); "
        "while true; do sleep 0.2; done"
    )
    job, first, waiting, folder = two_mount_job(demo, docker_client, f"standby-replaced-{swapped}", swap)
    (folder / "go").touch()
    wait_for(lambda: (folder / "team" / "data" / "which").exists(), message="the new folder")
    docker_client.containers.get(first.task_runs.get().container_id).kill()

    second = wait_for(lambda: job.attempts.filter(number=2, state=Attempt.State.RUNNING).first(), message="attempt 2")

    def seen() -> list[str]:  # a fresh row: what it says was persisted
        return log_texts(second.task_runs.get())

    wait_for(lambda: any(text.startswith("attempt 2 sees") for text in seen()), message="its line")
    assert "attempt 2 sees new" in seen()
    run = second.task_runs.get()
    if swapped:
        assert run.container_id != waiting.id  # the standby was refused: a fresh container mounts the new folder
        assert not docker_client.containers.list(all=True, filters={"id": waiting.id})
        said = what_the_job_went_through(job)
        assert "not used: the source of /mnt/data is not the folder it was started with" in said, said
    else:
        assert run.container_id == waiting.id  # the same folders: the armed standby went on
    terminated(job)


def test_an_images_healthcheck_never_runs_in_the_consoles_containers(demo, worker, docker_client):
    """Docker runs an image's HEALTHCHECK as the container's user, root here (the launcher's): it
    could write the control dir (forge a report, give an armed standby its go). The console's
    containers run none: neither the job's nor its armed standby."""
    tag = f"console-test/healthcheck-{TEST_LABEL[1]}:latest"  # one per session: another removes its own
    dockerfile = (
        f"FROM {BUSYBOX}\n"
        "HEALTHCHECK --interval=1s CMD "
        "sh -c 'id -u >> /.console/run/healthcheck; touch /.console/run/go'\n"
    )
    build_image(docker_client, tag, dockerfile)
    try:
        job, first, waiting = running_with_standby(demo, docker_client, "healthcheck", image=tag)
        time.sleep(3)  # three intervals of the image's healthcheck
        running = docker_client.containers.get(first.task_runs.get().container_id)
        for container in (running, waiting):
            container.reload()
            assert container.attrs["Config"]["Healthcheck"]["Test"] == ["NONE"]
            assert "Health" not in container.attrs["State"]
            assert engine.read_control_file(job.id, standby.name_of(container), "healthcheck") is None
        assert standby.is_standby(waiting)  # no go from anyone but the console
        terminated(job)
    finally:
        docker_client.images.remove(tag, force=True)
