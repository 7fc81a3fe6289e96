"""Host faults with a real second Docker engine: a host that dies is isolated and
its work moves (job level, or only the lost instance with rescheduling)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

import docker
import pytest

from jobs.models import DockerHost, EventKind, Phase, TrainingJob
from tests.conftest import BUSYBOX, submit_job, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class SecondEngine:
    """A dockerd of our own on a private socket: the host the tests kill."""

    def __init__(self):
        # Short paths: the exec root holds sockets, whose paths have a length limit.
        self.dir = tempfile.mkdtemp(prefix="d2-", dir="/tmp")
        self.socket = f"unix://{self.dir}/d.sock"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(os.path.join(self.dir, "dockerd.log"), "ab")
        self.proc = subprocess.Popen(
            [
                "dockerd", "--host", self.socket, "--data-root", f"{self.dir}/data", "--exec-root", f"{self.dir}/x",
                "--pidfile", f"{self.dir}/d.pid", "--bridge=none", "--iptables=false", "--ip-masq=false",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self._answers, timeout=30, message="the second dockerd")

    def _answers(self) -> bool:
        try:
            return docker.DockerClient(base_url=self.socket, timeout=2).ping()
        except Exception:
            return False

    def kill(self) -> None:
        """SIGKILL: the host is gone; its containers are orphaned, still running."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def cleanup(self) -> None:
        """Remove everything this engine ran, alive or killed, without restarting it
        (a dockerd restarted after SIGKILL may wait forever on its old containerd)."""
        if self.proc.poll() is None:
            for container in docker.DockerClient(base_url=self.socket, timeout=30).containers.list(all=True):
                container.remove(force=True)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # dockerd and its containerd
        except ProcessLookupError:
            pass
        for procs in glob.glob("/sys/fs/cgroup/*/docker/*/cgroup.procs"):
            container_id = procs.split("/")[-2]
            if os.path.isdir(f"{self.dir}/data/containers/{container_id}"):  # orphans of this engine only
                for pid in open(procs).read().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        subprocess.run(["pkill", "-9", "-f", self.dir], capture_output=True)  # containerd shims
        subprocess.run(["umount", "-R", f"{self.dir}/x"], capture_output=True)
        subprocess.run(["umount", "-R", f"{self.dir}/data"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def second_host(demo, docker_client):
    engine = SecondEngine()
    engine.start()
    image = subprocess.run(["docker", "save", BUSYBOX], capture_output=True, check=True).stdout
    docker.DockerClient(base_url=engine.socket, timeout=60).images.load(image)
    host = DockerHost.objects.create(name="second", base_url=engine.socket, pool=demo.pool)
    yield engine, host
    engine.cleanup()


def make_job(demo, **fields) -> TrainingJob:
    return submit_job(demo, **(dict(name="hosts") | fields))


def ended(job) -> bool:
    job.refresh_from_db()
    return job.is_final


def running_on(job, host_name: str) -> bool:
    attempt = job.attempts.order_by("-number").first()
    return bool(attempt) and attempt.task_runs.filter(host__name=host_name, state="running").exists()


def test_a_lost_host_is_isolated_and_the_job_moves_to_a_healthy_one(demo, worker, second_host):
    engine, second = second_host
    DockerHost.objects.filter(id=demo.host.id).update(enabled=False)  # place the job on "second"
    job = make_job(
        demo,
        fault_tolerance=True,
        max_restarts=2,
        command="echo attempt $MA_ATTEMPT on $(hostname); for i in $(seq 1 60); do echo tick $i; sleep 0.1; done",
    )
    wait_for(lambda: running_on(job, "second"), message="the job running on the second host")
    DockerHost.objects.filter(id=demo.host.id).update(enabled=True)
    wait_for(lambda: job.attempts.get().task_runs.get().log_lines >= 3, message="some log lines")
    killed_at = time.monotonic()
    engine.kill()
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    detection = time.monotonic() - killed_at
    assert job.phase == Phase.COMPLETED, job.phase_reason
    second.refresh_from_db()
    # Whichever noticed first isolates it: the job's follower or reconcile's host ping.
    assert second.isolated
    assert "unreachable" in second.isolation_reason or "lost connection" in second.isolation_reason
    record = job.recoveries.get()
    assert (record.failure_class, record.level, record.restart) == ("node_failure", "job", True)
    lost, moved = [a.task_runs.get() for a in job.attempts.order_by("number")]
    assert (lost.state, lost.host.name) == ("lost", "second")
    assert (moved.host.name, moved.exit_code) == ("local", 0)
    assert job.restarts_used == 1
    assert job.events.filter(kind=EventKind.HOST_ISOLATED).exists()
    assert detection < 60


def test_instance_rescheduling_moves_only_the_lost_instance(demo, worker, second_host):
    engine, second = second_host
    job = make_job(
        demo,
        node_count=2,
        fault_tolerance=True,
        max_restarts=2,
        pod_retry_num=1,
        command="echo rank $RANK attempt $MA_ATTEMPT; for i in $(seq 1 80); do echo tick $i; sleep 0.1; done",
    )
    wait_for(lambda: job.attempts.exists() and job.attempts.get().task_runs.filter(state="running").count() == 2,
             message="both instances running")  # fmt: skip
    first = {r.index: r for r in job.attempts.get().task_runs.select_related("host")}
    assert {r.host.name for r in first.values()} == {"local", "second"}  # spread over both hosts
    lost_index = next(i for i, r in first.items() if r.host.name == "second")
    kept_index = 1 - lost_index
    engine.kill()
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    assert (job.reschedules_used, job.restarts_used) == (1, 0)
    record = job.recoveries.get()
    assert (record.failure_class, record.level) == ("node_failure", "reschedule")
    second_attempt = {r.index: r for r in job.attempts.get(number=2).task_runs.select_related("host")}
    assert second_attempt[lost_index].host.name == "local"
    assert not second_attempt[lost_index].reuses_container
    # The surviving instance restarted in its own container (process level).
    assert second_attempt[kept_index].reuses_container
    assert second_attempt[kept_index].container_id == first[kept_index].container_id
    assert job.events.filter(kind=EventKind.RESCHEDULED).exists()


def test_an_idle_host_that_stops_answering_is_isolated(demo, worker, second_host):
    engine, second = second_host
    engine.kill()
    wait_for(lambda: DockerHost.objects.get(id=second.id).isolated, timeout=30, message="isolation by reconcile")
    assert "lost connection" in DockerHost.objects.get(id=second.id).isolation_reason
    assert not DockerHost.objects.get(id=demo.host.id).isolated
    # New jobs go to the healthy host only.
    job = make_job(demo, command="echo placed")
    wait_for(lambda: ended(job), message="the job to end")
    assert job.phase == Phase.COMPLETED
    assert job.attempts.get().task_runs.get().host.name == "local"
