"""The tests' browser in a network namespace of its own, as a user's browser is on a machine of its own.

Chromium watches the machine's network interfaces (netlink). When an address comes or goes, it fails
the requests that are waiting for a connection with net::ERR_NETWORK_CHANGED: a navigation ends on
its error page, a fetch rejects, the server never sees them. On this machine the engine makes and
removes a bridge for every multi-instance job, the other test sessions' ones included. That is the
cause that fits a login's POST that ended on chrome-error://chromewebdata/ without reaching daphne
(stop 48) and a wizard's notice that never came (issue 11). Measured here: a page posting to a
loopback server, 8,700 requests in 30 s while `docker network create` and `rm` ran in a loop: 44
failed with that error; from a namespace of its own, 6,350 requests under the same loop with a
container on each network: none (docs/decisions.md, "The tests' browser in a network namespace of
its own"; tests/test_browser_network.py).

The namespace holds loopback and a veth pair whose ends are both inside it, one with a documentation
address (192.0.2.1/32, no route anywhere), so that the browser counts itself online; IPv6 is off.
Each loopback port the pages use is forwarded by two socat processes: a TCP listener on
127.0.0.1:<port> inside the namespace, a Unix socket between (the file system is shared), a TCP
connection to the machine's 127.0.0.1:<port> outside. Pages keep their URLs, the server sees a
loopback client as before, and nothing the browser does can reach any other address.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.browser_page import CHROMIUM
from tests.processes import ManagedProcess
from tests.pytest_env import TMP

NETNS_DIR = Path("/run/netns")
NETNS_PREFIX = "console-browser-"
ONLINE_ADDRESS = "192.0.2.1/32"  # TEST-NET-1 (RFC 5737): never routed
ENDS_WITH_SESSION = ["setpriv", "--pdeathsig", "KILL"]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:  # e.g. not root: the browser tests need their namespace, and say why
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale_namespaces() -> None:
    """The namespaces of sessions that were killed before their end (a pid no longer running).
    Their listening forwarders died with them (`--pdeathsig`); a namespace nothing runs in is only
    a name. (One whose pid a later process took is left to the session that gets that pid.)"""
    if not NETNS_DIR.is_dir():
        return
    for entry in NETNS_DIR.iterdir():
        pid = entry.name.removeprefix(NETNS_PREFIX)
        if entry.name.startswith(NETNS_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            subprocess.run(["ip", "netns", "delete", entry.name], capture_output=True)


def _listening(pid: int, port: int, netns: Path) -> bool:
    """Whether process `pid` is in the namespace `netns` and that namespace has a TCP listener on
    127.0.0.1:`port`. In the namespace first: before nsenter's setns the process is in the
    machine's, where daphne itself listens on that port."""
    try:
        if os.stat(f"/proc/{pid}/ns/net").st_ino != os.stat(netns).st_ino:
            return False
    except FileNotFoundError:
        return False
    wanted = f"0100007F:{port:04X}"
    try:
        rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except FileNotFoundError:
        return False
    return any(row.split()[1] == wanted and row.split()[3] == "0A" for row in rows)  # 0A: LISTEN


class BrowserNetwork:
    """The namespace, its forwarders and the executable that starts Chromium inside it."""

    def __init__(self, ports: list[int]):
        self.name = f"{NETNS_PREFIX}{os.getpid()}"
        self.path = NETNS_DIR / self.name
        self.ports = ports
        self.forwarders: list[ManagedProcess] = []
        self.chromium = Path(TMP) / "chromium-in-its-network"

    def start(self) -> None:
        remove_stale_namespaces()
        # The name holds this session's pid: one left by an earlier, killed holder of the pid is stale.
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
        _ip("netns", "add", self.name)
        # No IPv6: an interface's link-local address comes a second or two after it is up (duplicate
        # address detection), a change of the browser's network that failed its requests as above.
        self._sysctl("net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
        _ip("-n", self.name, "link", "set", "lo", "up")
        # A veth pair with both ends inside (this machine's kernel has no dummy interfaces).
        _ip("-n", self.name, "link", "add", "online0", "type", "veth", "peer", "name", "online1")
        _ip("-n", self.name, "addr", "add", ONLINE_ADDRESS, "dev", "online0")
        _ip("-n", self.name, "link", "set", "online0", "up")
        _ip("-n", self.name, "link", "set", "online1", "up")
        for port in self.ports:
            self._forward(port)
        self.chromium.write_text(f'#!/bin/sh\nexec nsenter --net={self.path} {CHROMIUM} "$@"\n')
        self.chromium.chmod(0o755)

    def _sysctl(self, *settings: str) -> None:
        done = subprocess.run(
            ["nsenter", f"--net={self.path}", "sysctl", "-q", "-w", *settings], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"sysctl {' '.join(settings)} in {self.name}: {done.stderr.strip()}")

    def _forward(self, port: int) -> None:
        """127.0.0.1:`port` inside the namespace to the same address outside, through a Unix socket.
        `setpriv --pdeathsig`: a listening forwarder ends with its session, also when the session is
        killed (the child it forked for a connection ends when the connection does). A backlog of
        128, not socat's 5: a page opens six connections at once, the test's fetch loops more.
        Each is in `forwarders` before it starts, so that `stop` ends one that never got ready."""
        between = Path(TMP) / f"browser-{port}.sock"
        outside = ManagedProcess(
            f"browser-forward-{port}-outside",
            [
                *ENDS_WITH_SESSION,
                "socat",
                f"UNIX-LISTEN:{between},fork,unlink-early,backlog=128",
                f"TCP:127.0.0.1:{port}",
            ],
            ready=between.exists,
        )
        self.forwarders.append(outside)
        outside.start()
        inside = ManagedProcess(
            f"browser-forward-{port}-inside",
            [
                *ENDS_WITH_SESSION,
                "nsenter",
                f"--net={self.path}",
                "socat",
                f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,backlog=128",
                f"UNIX-CONNECT:{between}",
            ],
        )
        inside.ready = lambda: _listening(inside.proc.pid, port, self.path)  # nsenter execs socat: one pid
        self.forwarders.append(inside)
        inside.start()

    def stop(self) -> None:
        for forwarder in reversed(self.forwarders):
            forwarder.stop()
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
