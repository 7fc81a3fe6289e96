"""The engine's clients: one per thread and host, how each reaches its engine (a unix socket,
mutual TLS over tcp://, the system ssh client over ssh://), and the connections it keeps.

Part of the engine's edge (jobs/runtime/engine.py, which hands these clients out with the SDK's
errors turned into the console's): with engine.py, the only module that imports the docker SDK
(tests/test_architecture.py).
"""

from __future__ import annotations

import io
import socket
import subprocess
import threading

import docker
import docker.transport.sshconn

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
    if type(adapter) is docker.transport.UnixHTTPAdapter:
        adapter.__class__ = _OnePoolUnixAdapter  # its class, not a bound method: no cycle to collect
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
        return self._reader

    def shutdown(self, how: int) -> None:
        """What a socket's shutdown does for a read blocked in another thread (a followed log's
        close, a terminal's): it ends, here with the ssh process. (The socket object under this
        class is never connected: its own shutdown raised.)"""
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


def forget_client(host) -> None:
    """Drop this thread's clients of the host (after a broken stream: the next call reconnects)."""
    _api_versions.pop(host.base_url, None)  # the engine may have been upgraded while it was away
    clients = getattr(_local, "clients", {})
    for key in [k for k in clients if k[0] == host.base_url]:
        clients.pop(key).close()
