"""Docker plumbing for restart_latency.py: the engine's event stream, container logs with
Docker's timestamps, and the bare `start` the console's restarts are measured against.

Docker's own clock (event and log timestamps) is the one the benchmark compares everything on,
so these read it rather than timing on this side, except the bare start, which times the call."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from bench._stack import BENCH_LABEL, BUSYBOX
from bench._trace import ms
from tests.second_engine import SecondEngine as TestsSecondEngine
from tests.shared import wait_for

if TYPE_CHECKING:  # for the hints only: like the other bench modules, docker is imported where it is used
    from docker import DockerClient
    from docker.models.containers import Container

T = TypeVar("T")
# The label every benchmark container carries, so that the event stream sees them all.
LABELS = {BENCH_LABEL[0]: BENCH_LABEL[1]}


# -- Docker's event stream ------------------------------------------------------------------------
class Events(threading.Thread):
    """Every container event of containers labelled console.bench=1, as it happens."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="docker-events")
        import docker

        self.client = docker.from_env(timeout=None)
        self.stream = self.client.events(decode=True, filters={"type": "container", "label": "=".join(BENCH_LABEL)})
        self.items: list[dict] = []
        self.cond = threading.Condition()

    def run(self) -> None:
        try:
            for event in self.stream:
                with self.cond:
                    self.items.append(event)
                    self.cond.notify_all()
        except Exception:  # closed at the end
            pass

    def select(self, action: str, **labels) -> list[dict]:
        """Events whose Action starts with `action` and whose actor has these attributes."""
        with self.cond:
            items = list(self.items)
        out = []
        for event in items:
            attrs = event.get("Actor", {}).get("Attributes", {})
            if event.get("Action", "").startswith(action) and all(attrs.get(k) == v for k, v in labels.items()):
                out.append(event)
        return out

    def select_id(self, action: str, container_id: str) -> list[dict]:
        with self.cond:
            items = list(self.items)
        return [e for e in items if e.get("id") == container_id and e.get("Action", "").startswith(action)]

    def wait(self, predicate: Callable[[], T], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        with self.cond:  # an RLock: predicate() may select() inside
            while True:
                value = predicate()
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
                self.cond.wait(min(remaining, 0.2))

    def close(self) -> None:
        self.stream.close()
        self.client.close()


def log_lines(container: Container) -> list[tuple[int, str]]:
    from jobs.runtime.logs import parse_docker_timestamp

    out = []
    for raw in container.logs(timestamps=True).decode(errors="replace").splitlines():
        ts, _, text = raw.partition(" ")
        out.append((parse_docker_timestamp(ts), text))
    return out


def lines_once(
    container: Container, predicate: Callable[[str], bool], what: str, timeout: float = 30
) -> list[tuple[int, str]]:
    """The container's log (Docker's timestamps) once a line matching predicate is in it."""

    def ready():
        lines = log_lines(container)
        return lines if any(predicate(text) for _, text in lines) else None

    return wait_for(ready, timeout, message=what, interval=0.05)


def first_line(lines: list[tuple[int, str]], predicate: Callable[[str], bool]) -> int | None:
    return next((ts for ts, text in lines if predicate(text)), None)


def job_own(containers: list) -> Container | None:
    """Of a job's running containers, its own: a fault-tolerant job also runs its next attempt's
    standby (armed: waiting for a restart's go), whose attempt is one higher."""
    return min(containers, key=lambda c: int(c.labels.get("console.attempt", 0)), default=None)


def running_container(client: DockerClient, job_id: str, attempt: int) -> Container | None:
    found = client.containers.list(filters={"label": [f"console.job={job_id}", f"console.attempt={attempt}"]})
    return found[0] if found else None


# -- (a) bare start ----------------------------------------------------------------------------------
class BareStart:
    """A stopped busybox container, started again and again: `start` of the API, timed by the caller.
    Sampled up front and again between the console's restarts, so that both see the same load."""

    def __init__(self, client: DockerClient) -> None:
        self.container = client.containers.create(
            BUSYBOX, ["sh", "-c", "exit 0"], labels=LABELS, network_mode="none", name=f"bench-bare-{os.getpid()}"
        )
        self.samples: dict[str, list[float]] = {}
        for _ in range(2):  # warm-up
            self.container.start()
            self.container.wait()

    def sample(self, key: str = "api") -> float:
        t0 = time.perf_counter_ns()
        self.container.start()
        value = ms(time.perf_counter_ns() - t0)
        self.container.wait()
        self.samples.setdefault(key, []).append(value)
        return value

    def sample_cli(self) -> float:
        t0 = time.perf_counter_ns()
        subprocess.run(["docker", "start", self.container.id], check=True, stdout=subprocess.DEVNULL)
        value = ms(time.perf_counter_ns() - t0)
        self.container.wait()
        self.samples.setdefault("cli", []).append(value)
        return value

    def remove(self) -> None:
        self.container.remove(force=True)


# -- processes of a container, seen from the host (goodput.py's injections) ---------------------------
CGROUP_PROCS = (
    "/sys/fs/cgroup/pids/docker/{id}/cgroup.procs",  # cgroup v1, cgroupfs driver (this machine)
    "/sys/fs/cgroup/memory/docker/{id}/cgroup.procs",
    "/sys/fs/cgroup/system.slice/docker-{id}.scope/cgroup.procs",  # cgroup v2, systemd driver
    "/sys/fs/cgroup/docker/{id}/cgroup.procs",  # cgroup v2, cgroupfs driver
)


def container_host_pids(container_id: str) -> list[int]:
    """The host PIDs of a container's processes, from its cgroup: works for any engine on this
    machine, and still after that engine died (its containers' processes live on, orphaned)."""
    for pattern in CGROUP_PROCS:
        try:
            with open(pattern.format(id=container_id)) as f:
                return [int(pid) for pid in f.read().split()]
        except FileNotFoundError:
            continue
    return []


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def python_process(container_id: str, script: str) -> int | None:
    """The host PID of the Python process running `script` in the container (not a shell that
    names it in its command line)."""
    for pid in container_host_pids(container_id):
        argv = cmdline(pid)
        if argv and os.path.basename(argv[0]).startswith("python") and any(script in a for a in argv[1:]):
            return pid
    return None


# -- a second Docker engine: the host a benchmark loses ----------------------------------------------
class SecondEngine(TestsSecondEngine):
    """A dockerd of the benchmark's own on a private socket: tests/second_engine.py's, started and
    answering as there, with a lost machine and a clean-up of its own.

    lose() is a lost machine: the engine and its containerd die by SIGKILL first (nobody reports
    an exit), then every process of its containers and its shims; cleanup() removes the rest.
    Every process it kills was started by this engine: its containers are told apart by their
    folders in this engine's data root, its shims by this engine's private paths."""

    def client(self, timeout: int = 60) -> DockerClient:
        import docker

        return docker.DockerClient(base_url=self.socket, timeout=timeout)

    def load_image(self, image: str) -> None:
        """`docker save | docker load` from the local engine (no registry is reachable)."""
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", self.socket, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        save.stdout.close()
        if save.wait() != 0:
            raise RuntimeError(f"docker save {image} failed")

    def container_ids(self) -> list[str]:
        folder = os.path.join(self.dir, "data", "containers")
        return os.listdir(folder) if os.path.isdir(folder) else []

    def json_log(self, container_id: str) -> str:
        """A container's json-file log, read from the data root (also after the engine died)."""
        return os.path.join(self.dir, "data", "containers", container_id, f"{container_id}-json.log")

    def _kill(self, pids: list[int]) -> None:
        import signal

        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _own_processes(self) -> list[int]:
        """Processes whose command line names this engine's private folder (containerd, shims)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and any(self.dir in part for part in cmdline(int(entry))):
                found.append(int(entry))
        return found

    def lose(self) -> float:
        """The host is lost: returns when (time.time()) its engine was killed."""
        import signal

        lost_at = time.time()
        os.killpg(self.proc.pid, signal.SIGKILL)  # dockerd and its containerd: no exit is reported
        self.proc.wait()
        for container_id in self.container_ids():
            self._kill(container_host_pids(container_id))
        self._kill(self._own_processes())  # the shims, now without their containers
        return lost_at

    def cleanup(self) -> None:
        import shutil
        import signal

        if self.proc is not None and self.proc.poll() is None:
            try:
                for container in self.client(30).containers.list(all=True, sparse=True):
                    try:
                        container.remove(force=True)
                    except Exception:  # gone meanwhile, or being removed: the engine dies next
                        pass
            except Exception:
                pass
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for container_id in self.container_ids():
            self._kill(container_host_pids(container_id))
        self._kill(self._own_processes())
        # The engine's mounts (container file systems, network namespaces), deepest first: a
        # killed engine unmounts nothing itself.
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[1].startswith(self.dir + "/")]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
