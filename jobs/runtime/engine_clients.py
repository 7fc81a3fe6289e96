"""The engine's clients: one per thread and host, how each reaches its engine (a unix socket,
mutual TLS over tcp://, the system ssh client over ssh://), and the connections it keeps.

Part of the engine's edge (jobs/runtime/engine.py, which hands these clients out with the SDK's
errors turned into the console's): with engine.py, the only module that imports the docker SDK
(tests/test_architecture.py).
"""

from __future__ import annotations

import io
import os
import queue
import socket
import subprocess
import threading
import time

import docker
import docker.transport.sshconn
import urllib3

from .timed_pipes import PipeReader, PipeWriter

_local = threading.local()
_api_versions: dict[str, str] = {}


def client_for(host, *, timeout: int | None = 30) -> docker.DockerClient:
    """A client per thread and host (anything with a `base_url`, a DockerHost): requests
    sessions are not shared across threads. timeout None: each call may wait for ever (a
    followed log needs no such client: log_stream turns its own socket's timeout off)."""
    clients = getattr(_local, "clients", None)
    if clients is None:
        clients = _local.clients = {}
    # The TLS files are part of the key: files an operator changed in the admin take effect.
    key = (
        host.base_url,
        timeout,
        *(getattr(host, f, "") for f in ("tls_ca_cert", "tls_client_cert", "tls_client_key")),
    )
    _close_idle_ssh_connections()
    if key not in clients:
        # The API version is asked once per engine and process (a GET /version per new client
        # sat on every restart's path).
        version = _api_versions.get(host.base_url)
        if version is None:
            probe = _new_client(host, timeout or 30, docker.constants.MINIMUM_DOCKER_API_VERSION)
            try:
                version = probe.api.version(api_version=False)["ApiVersion"]
            finally:
                probe.close()
            _api_versions[host.base_url] = version
        clients[key] = _new_client(host, timeout, version)
    return clients[key]


class _OnePoolUnixAdapter(docker.transport.UnixHTTPAdapter):
    """The SDK's unix-socket transport keeps a connection pool per request URL (each container's
    path, each query): a call to a new URL opened a new connection to the engine, and each client
    kept up to 25 of them open, so an idle worker held some 850 (bench/worker_soak.py). Here one
    pool serves every URL of the socket: calls take the client's kept-alive connections."""

    def get_connection(self, url, proxies=None):
        return super().get_connection(self.socket_path, proxies)


def _new_client(host, timeout: int | None, version: str) -> docker.DockerClient:
    """A client with a known API version (so that making it asks the engine nothing)."""
    client = docker.DockerClient(base_url=host.base_url, timeout=timeout, version=version, **_transport(host))
    adapter = getattr(client.api, "_custom_adapter", None)
    # Their class swapped, not a method bound on them: a bound method would be a cycle to collect.
    if type(adapter) is docker.transport.UnixHTTPAdapter:
        adapter.__class__ = _OnePoolUnixAdapter
    elif type(adapter) is docker.transport.SSHHTTPAdapter:
        adapter.__class__ = _SharedPoolSSHAdapter
        adapter.engine_url = host.base_url
    # The engine's CA is the host's own: requests would otherwise take REQUESTS_CA_BUNDLE /
    # CURL_CA_BUNDLE from the environment over it (and refuse the engine's certificate), and
    # HTTPS_PROXY would send the engine's API through a proxy.
    client.api.trust_env = False
    return client


def _transport(host) -> dict:
    """The SDK's own options for how the engine is reached (README "More Docker hosts"): mutual
    TLS for tcp:// (the host's three files; verify the engine's certificate), the system ssh
    client for ssh:// (its ~/.ssh/config and agent, as an operator's `docker -H ssh://` does)."""
    url = host.base_url
    if url.startswith("tcp://") and getattr(host, "tls_client_cert", ""):
        return {
            "tls": docker.tls.TLSConfig(
                client_cert=(host.tls_client_cert, host.tls_client_key), ca_cert=host.tls_ca_cert, verify=True
            )
        }
    if url.startswith("ssh://"):
        return {"use_ssh_client": True}
    return {}


class _SSHSocketWithTimeouts(docker.transport.sshconn.SSHSocket):
    """The SDK's socket over `ssh HOST docker system dial-stdio`, with what a socket has: urllib3
    sets the call's timeout before each request and answer (None: a follower's stream) and the
    reads, and the writes waiting for room in the pipe, wait no longer; recv gives what has come
    (one read of the pipe), not `n` bytes or the end (the SDK's waited for either); a write after
    the end is a broken pipe (an OSError, as a socket's, where the SDK's raised a bare Exception);
    closing after the ssh process ended is no error (the SDK's wrote to its closed stdin: a broken
    pipe out of every exec's end)."""

    def __init__(self, host):
        super().__init__(host)
        self._timeout: float | None = None
        self._shut = False
        self._reader: io.BufferedReader | None = None
        self._writer: PipeWriter | None = None

    def settimeout(self, value) -> None:
        self._timeout = float(value) if isinstance(value, int | float) else None

    def gettimeout(self) -> float | None:
        return self._timeout

    def connect(self, **kwargs) -> None:
        super().connect(**kwargs)
        self._reader = io.BufferedReader(PipeReader(self.proc.stdout, self))
        self._writer = PipeWriter(self.proc.stdin, self)

    def recv(self, n: int) -> bytes:
        if self._reader is None:
            return super().recv(n)  # the SDK's error: not connected
        return self._reader.read1(n)

    def _write(self, data) -> int:
        if self._writer is None:
            raise BrokenPipeError("the connection to the engine over ssh is closed")
        return self._writer.write(data)

    def makefile(self, mode):
        if not self.proc:
            self.connect()
        self._reader.channel = self  # the SDK finds an exec's socket here
        return _AnswerFile(self._reader)

    def dropped(self) -> bool:
        """Whether this connection, idle, cannot take another call: it was shut down, its ssh
        process ended, or its pipe has something to read (the end: an idle HTTP connection is sent
        nothing)."""
        if self._shut or self.proc is None or self._reader is None or self.proc.poll() is not None:
            return True
        return self._reader.raw.has_input()

    def shutdown(self, how: int) -> None:
        """What a socket's shutdown does for a read blocked in another thread (a followed log's
        close, a terminal's): it ends, here with the ssh process. (The socket object under this
        class is never connected: its own shutdown raised.)"""
        self._shut = True
        if self.proc is not None:
            self.proc.terminate()

    def close(self) -> None:
        """The ssh process ended (the SDK's close first wrote to its stdin, which can wait for
        ever on a process that stopped reading, and raised once it had ended), its pipes closed."""
        if self.proc is not None:
            self.proc.terminate()  # first: a write waiting for room ends, and the pipe can close
            if self._writer is not None:
                self._writer.end()
            try:
                self.proc.wait(5)  # no zombie per connection
            except subprocess.TimeoutExpired:  # one that ignores being asked
                self.proc.kill()
                try:
                    self.proc.wait(1)
                except subprocess.TimeoutExpired:
                    pass
            if self._reader is not None:
                self._reader.raw.end()  # two descriptors per connection: stdin above, stdout here
        socket.socket.close(self)  # the socket object's own descriptor


# Every ssh:// client of the process (the SDK makes its SSHSocket by this name at each connection).
docker.transport.sshconn.SSHSocket = _SSHSocketWithTimeouts


class _AnswerFile:
    """What http.client reads one answer from: the connection's buffered pipe, left open by its
    close. http.client closes an answer's file once the answer is read; the kept connection's next
    answer reads on from the same buffer (the SDK handed out the pipe itself, which that closed)."""

    def __init__(self, reader: io.BufferedReader):
        self._reader = reader
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def __getattr__(self, name: str):
        return getattr(self._reader, name)


# Idle connections kept per ssh:// engine and process: each is an `ssh` here and a
# `docker system dial-stdio` on the host. More may be open at once; one given back beyond these ends.
KEPT_SSH_CONNECTIONS = 10
# A kept connection unused this long is closed rather than taken again: the host may have dropped
# it meanwhile without a word (rebooted, a firewall's idle timeout), and the call on it would fail
# as if the host refused. Reconcile's pings every few seconds keep one in use per host.
KEPT_SSH_IDLE_S = 30.0
# Keyed by process too: a forked child makes its own, and the parent's are never closed from it
# (nothing runs at the fork: the SDK starts each ssh with a preexec_fn, so a hook would run in
# every such child before its exec).
_ssh_pools: dict[tuple[int, str], _KeptSSHConnectionPool] = {}
_ssh_pools_lock = threading.Lock()
_ssh_swept_at = 0.0


class _KeptSSHConnectionPool(docker.transport.sshconn.SSHConnectionPool):
    """The connections to one ssh:// engine, shared by every thread's client in the process. The
    SDK made a new pool for each request (its pipe could not outlive one answer), so every call
    started an `ssh` here and a `docker system dial-stdio` on the host: ~300 ms a call over a real
    sshd on loopback, against under a millisecond on the local socket (bench/ssh_engine.py).
    A connection given back is taken again unless it has dropped (`_SSHSocketWithTimeouts.dropped`)
    or was unused for KEPT_SSH_IDLE_S; one that has is closed, and the call connects anew."""

    def _get_conn(self, timeout=None):
        try:
            conn = super()._get_conn(timeout)
        except urllib3.exceptions.ClosedPoolError:
            # forget_client closed the pool after this request took it (another thread's broken
            # stream): a connection of its own, closed when given back, not a refused host.
            return self._new_conn()
        if conn.sock is not None and (_idle_too_long(conn, time.monotonic()) or conn.sock.dropped()):
            conn.close()
        return conn

    def _put_conn(self, conn) -> None:
        """Kept with the time it was given back; one beyond KEPT_SSH_CONNECTIONS is closed quietly
        (urllib3 warns of each: a burst of calls to one host is no fault)."""
        if conn is not None:
            conn.kept_since = time.monotonic()
        try:
            self.pool.put(conn, block=False)  # None too: the slot a failed request took
        except (AttributeError, queue.Full):  # closed (pool None), or full
            if conn is not None:
                conn.close()

    def close_idle(self, now: float) -> None:
        """Close the kept connections unused for KEPT_SSH_IDLE_S, keep the others."""
        taken = []
        try:
            while True:
                taken.append(self.pool.get(block=False))
        except (AttributeError, queue.Empty):  # closed meanwhile, or all taken
            pass
        for conn in taken:
            if conn is not None and _idle_too_long(conn, now):
                conn.close()
                conn = None
            try:
                self.pool.put(conn, block=False)
            except (AttributeError, queue.Full):
                if conn is not None:
                    conn.close()


def _idle_too_long(conn, now: float) -> bool:
    return now - getattr(conn, "kept_since", now) > KEPT_SSH_IDLE_S


def _close_idle_ssh_connections() -> None:
    """Every engine's kept connections unused for KEPT_SSH_IDLE_S closed (once in that time, from
    any client handed out): an engine no longer asked (disabled, isolated, deleted, its URL
    changed) keeps no ssh here and no dial-stdio there."""
    global _ssh_swept_at
    now = time.monotonic()
    if now - _ssh_swept_at < KEPT_SSH_IDLE_S:
        return
    with _ssh_pools_lock:
        if now - _ssh_swept_at < KEPT_SSH_IDLE_S:
            return
        _ssh_swept_at = now
        pools = [pool for (pid, _), pool in _ssh_pools.items() if pid == os.getpid()]
    for pool in pools:
        pool.close_idle(now)


class _SharedPoolSSHAdapter(docker.transport.SSHHTTPAdapter):
    """An ssh:// client's transport, whose every request takes its engine's kept pool."""

    engine_url: str

    def get_connection(self, url, proxies=None):
        key = (os.getpid(), self.engine_url)
        with _ssh_pools_lock:
            pool = _ssh_pools.get(key)
            if pool is None:
                pool = _ssh_pools[key] = _KeptSSHConnectionPool(
                    timeout=self.timeout, maxsize=KEPT_SSH_CONNECTIONS, host=self.ssh_host
                )
            return pool


def forget_client(host) -> None:
    """Drop this thread's clients of the host, and the process's idle connections to it if it is
    an ssh:// engine (after a broken stream, a failed ping: the next call reconnects)."""
    _api_versions.pop(host.base_url, None)  # the engine may have been upgraded while it was away
    with _ssh_pools_lock:
        pool = _ssh_pools.pop((os.getpid(), host.base_url), None)
    if pool is not None:
        pool.close()  # the idle ones; one in use ends when it is given back
    clients = getattr(_local, "clients", {})
    for key in [k for k in clients if k[0] == host.base_url]:
        clients.pop(key).close()
