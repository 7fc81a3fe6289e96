#!/usr/bin/env python3
"""An ssh:// engine's calls: what each call the console makes to a Docker host over ssh costs,
against the same calls made by the SDK's own ssh transport and on the local socket, measured in
the same run.

A real sshd on loopback (this benchmark's own: a free port, its own host key and authorized key,
ended at the end) stands in for a remote host; behind it `docker system dial-stdio` reaches this
machine's engine, as on a host. The console's client (jobs/runtime/engine.py) asks: a container's
inspect, a ping, a listing by label, and a stop and start of a container (the calls of a Stop and
of a restart). The SDK's own ssh transport asks the same of the same engine (the baseline: a new
`ssh` and dial-stdio per request), and so does the console's client on the local socket.
Then eight threads ask at once. Every `ssh` started is counted (a wrapper on PATH logs each).

Targets (issue "One supervisor that scales", for hosts reached over ssh): the console starts no
`ssh` per call (one for all the calls of one thread, at most one per thread calling at once), and
what ssh adds to the median of each kind of call (over the local socket's) is at most a tenth of
what it adds with the SDK's transport.

Needs `sshd` (Debian: `apt-get install openssh-server`; not started as a service here).

    .venv/bin/python bench/ssh_engine.py [--calls 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import BENCH_LABEL, BUSYBOX, RUN_LABEL, percentile, remove_bench_containers, verdict  # noqa: E402
from tests.shared import free_port, wait_for  # noqa: E402

SSHD = "/usr/sbin/sshd"
THREADS = 8
TARGET_SHARE_OF_SDK = 0.1  # of the time the SDK transport adds to a call


class Host:
    """What the engine's edge needs of a DockerHost."""

    def __init__(self, name: str, base_url: str):
        self.name, self.base_url = name, base_url


class LoopbackSshd:
    """sshd on 127.0.0.1 as this user, with keys of its own, and an `ssh` on PATH that uses them
    (the SDK runs plain `ssh`) and logs each start."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.started_log = tmp / "ssh-started.log"
        for key in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / key)], check=True)
        (tmp / "authorized_keys").write_text((tmp / "user_key.pub").read_text())
        (tmp / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host_key'}\n"
            f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nStrictModes no\nUsePAM no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            f"PidFile {tmp / 'sshd.pid'}\n"
        )
        (tmp / "ssh_config").write_text(
            f"Host 127.0.0.1\n  IdentityFile {tmp / 'user_key'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
            f"  StrictHostKeyChecking accept-new\n  UserKnownHostsFile {tmp / 'known_hosts'}\n  LogLevel ERROR\n"
        )
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "ssh"
        wrapper.write_text(
            f'#!/bin/sh\necho "$*" >> {self.started_log}\nexec /usr/bin/ssh -F {tmp / "ssh_config"} "$@"\n'
        )
        wrapper.chmod(0o755)
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(tmp / "sshd_config")], **quiet)
        wait_for(
            lambda: subprocess.run(["ssh", "-p", str(self.port), "127.0.0.1", "true"], **quiet).returncode == 0, 20
        )
        self.base_url = f"ssh://{os.environ.get('USER', 'root')}@127.0.0.1:{self.port}"

    def started(self) -> int:
        return len(self.started_log.read_text().splitlines()) if self.started_log.exists() else 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def timed(call, times: int) -> list[float]:
    """Milliseconds of each of `times` calls, ascending."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1000)
    return sorted(took)


def console_calls(host: Host, container_id: str, label: str) -> dict:
    from jobs.runtime import engine

    def stop_and_start() -> None:
        engine.stop_ref(host, container_id, timeout=0)
        engine.start_container(engine.container(host, container_id))

    return {
        "inspect": lambda: engine.container(host, container_id),
        "ping": lambda: engine.ping(host),
        "list by label": lambda: engine.containers_labelled(host, label),
        "stop + start": stop_and_start,
    }


def sdk_calls(base_url: str, container_id: str, label: str) -> dict:
    """The SDK's own ssh transport (use_ssh_client, its adapter as it comes)."""
    import docker

    client = docker.DockerClient(base_url=base_url, use_ssh_client=True, timeout=30)

    def stop_and_start() -> None:
        client.api.stop(container_id, timeout=0)
        client.api.start(container_id)

    return {
        "inspect": lambda: client.containers.get(container_id),
        "ping": client.ping,
        "list by label": lambda: client.containers.list(filters={"label": label}),
        "stop + start": stop_and_start,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30, help="calls of each kind by each client")
    args = parser.parse_args()
    if not os.path.exists(SSHD):
        print(f"{SSHD} is missing: apt-get install openssh-server (the benchmark starts its own on loopback)")
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django
    import docker

    django.setup()
    from django.conf import settings

    run = uuid.uuid4().hex[:8]
    label = f"{RUN_LABEL}={run}"
    local = docker.from_env()
    made = local.containers.run(
        BUSYBOX, ["sleep", "3600"], detach=True, labels={BENCH_LABEL[0]: BENCH_LABEL[1], RUN_LABEL: run},
        network_mode="none",
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp:
        sshd = LoopbackSshd(Path(tmp))
        try:
            over_ssh = Host("over-ssh", sshd.base_url)
            clients = {
                "console, ssh://": console_calls(over_ssh, made.id, label),
                "SDK, ssh://": sdk_calls(sshd.base_url, made.id, label),
                "console, local socket": console_calls(Host("local", settings.DEFAULT_DOCKER_URL), made.id, label),
            }
            results: dict[tuple[str, str], list[float]] = {}
            started: dict[str, int] = {}
            for name, calls in clients.items():
                before = sshd.started()
                for kind, call in calls.items():
                    call()  # a first call (a client made, an API version asked) is not measured
                    results[name, kind] = timed(call, args.calls)
                started[name] = sshd.started() - before

            before = sshd.started()
            ask = console_calls(over_ssh, made.id, label)["inspect"]
            failures: list[BaseException] = []

            def many() -> None:
                try:
                    timed(ask, args.calls)
                except BaseException as exc:  # noqa: BLE001 - counted and printed
                    failures.append(exc)

            threads = [threading.Thread(target=many) for _ in range(THREADS)]
            t0 = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            parallel_ms = (time.perf_counter() - t0) * 1000
            started_parallel = sshd.started() - before
        finally:
            sshd.stop()
            remove_bench_containers(run)

    print(f"\n{'calls (ms)':<24}" + "".join(f"{name:>30}" for name in clients))
    for kind in clients["SDK, ssh://"]:
        cells = []
        for name in clients:
            took = results[name, kind]
            cells.append(f"{statistics.median(took):>14.1f} / {percentile(took, 95):>7.1f} p95")
        print(f"{kind:<24}" + "".join(f"{c:>30}" for c in cells))
    total = args.calls * len(clients["SDK, ssh://"])
    for name in ("console, ssh://", "SDK, ssh://"):
        print(f"{name}: {started[name]} ssh processes started for {total} calls (and a first call of each kind)")
    print(
        f"{THREADS} threads x {args.calls} inspects at once over ssh:// with the console's client: "
        f"{parallel_ms:.0f} ms, {started_parallel} ssh processes started, {len(failures)} failed"
    )

    ratios_of = list(clients["SDK, ssh://"])

    def added_by_ssh(name: str, kind: str) -> float:
        return statistics.median(results[name, kind]) - statistics.median(results["console, local socket", kind])

    ratios = {kind: added_by_ssh("console, ssh://", kind) / added_by_ssh("SDK, ssh://", kind) for kind in ratios_of}
    return verdict(
        {
            f"no ssh per call: {started['console, ssh://']} started for {total + len(ratios)} calls (<= 1)": started[
                "console, ssh://"
            ]
            <= 1,
            f"at most one ssh per thread at once: {started_parallel} for {THREADS} threads (<= {THREADS})": (
                started_parallel <= THREADS and not failures
            ),
            "what ssh adds to the console's median <= 0.1x what it adds to the SDK's: "
            + ", ".join(f"{kind} {ratio:.3f}x" for kind, ratio in ratios.items()): all(
                ratio <= TARGET_SHARE_OF_SDK for ratio in ratios.values()
            ),
        },
        [repr(exc) for exc in failures[:3]],
    )


if __name__ == "__main__":
    sys.exit(main())
