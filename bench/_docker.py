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


def poll(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


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

    return poll(ready, timeout, what)


def first_line(lines: list[tuple[int, str]], predicate: Callable[[str], bool]) -> int | None:
    return next((ts for ts, text in lines if predicate(text)), None)


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
