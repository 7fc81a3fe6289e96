"""A second Docker engine of the tests' own (the host the tests kill): a dockerd on a private
socket, and its clean-up without restarting it. The `second_host` fixture is in conftest.py."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile

import docker

from tests.shared import wait_for


class SecondEngine:
    """A dockerd of our own on a private socket: the host the tests kill."""

    def __init__(self, extra_args: list[str] | None = None):
        # Short paths: the exec root holds sockets, whose paths have a length limit.
        self.dir = tempfile.mkdtemp(prefix="d2-", dir="/tmp")
        self.socket = f"unix://{self.dir}/d.sock"
        self.extra_args = extra_args or []  # e.g. a TLS-verified TCP listener besides the socket
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(os.path.join(self.dir, "dockerd.log"), "ab")
        self.proc = subprocess.Popen(
            [
                "dockerd", "--host", self.socket, "--data-root", f"{self.dir}/data", "--exec-root", f"{self.dir}/x",
                "--pidfile", f"{self.dir}/d.pid", "--bridge=none", "--iptables=false", "--ip-masq=false",
                *self.extra_args,
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
            client = docker.DockerClient(base_url=self.socket, timeout=30)
            # sparse: a container a follower removes meanwhile is not an error of the listing
            for container in client.containers.list(all=True, sparse=True):
                try:
                    container.remove(force=True)
                except docker.errors.APIError:
                    pass  # gone, or its removal by a follower is in progress (409): the engine is killed next
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # dockerd and its containerd
        except ProcessLookupError:
            pass
        for procs in glob.glob("/sys/fs/cgroup/*/docker/*/cgroup.procs"):
            container_id = procs.split("/")[-2]
            if os.path.isdir(f"{self.dir}/data/containers/{container_id}"):  # orphans of this engine only
                try:
                    pids = open(procs).read().split()
                except FileNotFoundError:  # its last process ended since the listing: the cgroup went
                    continue
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        subprocess.run(["pkill", "-9", "-f", self.dir], capture_output=True)  # containerd shims
        subprocess.run(["umount", "-R", f"{self.dir}/x"], capture_output=True)
        subprocess.run(["umount", "-R", f"{self.dir}/data"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
