"""The console's edge with the Docker engine: with engine_clients.py (its clients, handed out
here), the only module that imports the docker SDK (tests/test_architecture.py holds the rest of
the code to that).

- Errors: every call here raises the console's own `EngineError` (`NotFound`, `ImageNotFound`,
  `Unreachable`, `NoAnswerInTime`), never the SDK's; `HOST_ERRORS` is what a caller catches when the engine (or
  its host) refused or could not answer.
- Clients per thread and host, containers, networks, volumes and mounts: the runtime holds the
  SDK's objects only as handles it passes back here (reading `.id`, `.name`, `.status`, `.attrs`).
- The runtime tools and the control dir (the trusted channel) are host folders beside the API:
  jobs/runtime/control.py, whose functions are named here too.
- `exec_bounded`: a `docker exec` with a timeout enforced inside the container (the
  tools' `timeout`) and on the socket, whose output is read up to a cap.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import docker
import requests
import urllib3

from . import engine_clients
from .dbpool import release_connection_if_pooled
from .logframes import frames_in_blocks

log = logging.getLogger(__name__)


# -- errors at the edge ---------------------------------------------------------------------------------
class EngineError(Exception):
    """The engine refused a call (`status_code` is its HTTP status) or could not be asked."""

    def __init__(self, message: str, status_code: int | None = None, explanation: str = ""):
        super().__init__(message)
        self.status_code = status_code
        self.explanation = explanation or message


class NotFound(EngineError):
    """No such container, network or volume (404)."""


class ImageNotFound(NotFound):
    """The image is not on the host (no registry: images are built locally)."""


class Unreachable(EngineError):
    """No answer: the host's engine is down, or the connection broke or timed out."""


class NoAnswerInTime(Unreachable):
    """No answer within the call's timeout: the engine is busy or hung (one call cannot tell)."""


HOST_ERRORS = (EngineError,)
_TIMEOUTS = (requests.exceptions.Timeout, TimeoutError, urllib3.exceptions.TimeoutError)


def _timed_out(exc: BaseException | None, depth: int = 6) -> bool:
    """Whether this error is or wraps (its cause, args or reason) a timeout. Not a refused
    connection: urllib3 files NewConnectionError under its ConnectTimeoutError."""
    if exc is None or depth == 0 or isinstance(exc, urllib3.exceptions.NewConnectionError):
        return False
    inner = [*exc.args, getattr(exc, "reason", None), exc.__cause__]  # ssl.SSLError's reason is a str
    return isinstance(exc, _TIMEOUTS) or any(_timed_out(e, depth - 1) for e in inner if isinstance(e, BaseException))


@contextmanager
def _edge() -> Iterator[None]:
    """The SDK's exceptions turned into the console's, once, here. A call here may wait seconds
    on a busy engine: the thread gives its pooled database connection back first (dbpool)."""
    release_connection_if_pooled()
    try:
        yield
    except EngineError:
        raise
    except docker.errors.ImageNotFound as exc:
        raise ImageNotFound(str(exc), 404, str(exc.explanation or exc)) from exc
    except docker.errors.NotFound as exc:
        raise NotFound(str(exc), 404, str(exc.explanation or exc)) from exc
    except docker.errors.APIError as exc:
        raise EngineError(str(exc), exc.status_code, str(exc.explanation or exc)) from exc
    except (
        docker.errors.DockerException,
        requests.exceptions.RequestException,
        urllib3.exceptions.HTTPError,  # a streamed body read past requests (a log's rest, cut short)
        OSError,
    ) as exc:
        raise (NoAnswerInTime if _timed_out(exc) else Unreachable)(str(exc)) from exc


def _at_edge(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with _edge():
            return func(*args, **kwargs)

    return wrapper


TOOLS_MOUNT = "/.console/bin"
BUSYBOX = f"{TOOLS_MOUNT}/busybox"
CONTROL_MOUNT = "/.console/run"
# The console's own mounts in every container, beside the job's layout (read-only, read-write).
CONSOLE_MOUNTS = {TOOLS_MOUNT: False, CONTROL_MOUNT: True}
ROOT_USER = "0:0"
MA_USER = "1000:1000"

# The tools dir and the control dir are plain files on the host (jobs/runtime/control.py); part
# of this module's API, as the mounts that carry them are.
from .control import (  # noqa: E402, F401
    CONTROL_FILE_MAX_BYTES,
    ToolsMissing,
    control_dir,
    control_root,
    make_control_dir,
    read_control_file,
    remove_control_dirs,
    remove_control_file,
    runtime_tools_dir,
    write_control_file,
)
from .control import wake as wake_launcher  # noqa: E402, F401 - "wake" alone would not say whom

# -- clients (jobs/runtime/engine_clients.py) ---------------------------------------------------------
client_for = _at_edge(engine_clients.client_for)
forget_client = engine_clients.forget_client


@_at_edge
def ping(host, *, timeout: int = 5) -> None:
    """Ask the host's engine whether it is there; raises Unreachable (or EngineError) if not."""
    client_for(host, timeout=timeout).ping()


# -- containers ----------------------------------------------------------------------------------------
@_at_edge
def container(host, ref: str, *, timeout: int | None = 30):
    """The container named or identified by `ref` on the host; NotFound if there is none."""
    return client_for(host, timeout=timeout).containers.get(ref)


def on_this_thread(container, host, *, timeout: int = 30):
    """The same container through this thread's own client of its host (bounded by `timeout`),
    for calls from another thread than the one that looked it up: clients are per thread. Asks
    the engine nothing, except its API version when this
    process has not talked to it yet (then it may raise the engine's errors, as any call)."""
    return client_for(host, timeout=timeout).containers.prepare_model(dict(container.attrs))


def container_or_none(host, ref: str):
    try:
        return container(host, ref)
    except NotFound:
        return None


@_at_edge
def containers_labelled(host, labels: str | list[str]) -> list:
    """Every container (running or not) with these labels (`key=value`), from one sparse listing:
    their `.attrs` hold what a listing gives (Names, Created, State), not a full inspect."""
    return client_for(host).containers.list(all=True, sparse=True, filters={"label": labels})


@_at_edge
def create_container(host, spec: dict, *, network_alias: str | None = None):
    """Create (not start) a container from `spec` (the SDK's `containers.create` arguments);
    on a network, the other containers know it by `network_alias`."""
    client = client_for(host)
    spec = dict(spec)
    if network_alias and spec.get("network") not in (None, "none"):
        spec["networking_config"] = {spec["network"]: client.api.create_endpoint_config(aliases=[network_alias])}
    return client.containers.create(**spec)


@_at_edge
def start_container(container) -> None:
    """Start a created container; one a concurrent start started meanwhile is left as it is."""
    try:
        container.start()
    except docker.errors.APIError as exc:
        if exc.status_code not in (304, 409):
            raise
    container.reload()


@_at_edge
def refresh(container) -> None:
    """Read the container's state again (`.status`, `.attrs`)."""
    container.reload()


@_at_edge
def signal_container(container, signal: str) -> None:
    """Send PID 1 a signal; a container that ended meanwhile (404, 409) is not an error."""
    try:
        container.kill(signal=signal)
    except docker.errors.APIError as exc:
        if exc.status_code not in (404, 409):
            raise


@_at_edge
def stop_container(container, *, timeout: int) -> None:
    """docker stop: SIGTERM (the launcher forwards it), SIGKILL after `timeout` seconds."""
    container.stop(timeout=timeout)


@_at_edge
def stop_ref(host, ref: str, *, timeout: int) -> None:
    """docker stop of the container named or identified by `ref`, without looking it up first:
    one call to the engine, not two (a stop is on the path the user waits on, and a busy engine
    answers each call later). NotFound if there is none; one already ended is not an error."""
    client_for(host).api.stop(ref, timeout=timeout)


@_at_edge
def remove_container(container) -> None:
    """Remove the container, running or not; one already gone, or whose removal another caller
    started (409 "removal ... is already in progress": the orphan scan and a job's end may meet
    on a standby), is not an error."""
    try:
        container.remove(force=True, v=True)  # v: the anonymous volumes of an image's VOLUME go too
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409 or "already in progress" not in str(exc.explanation or ""):
            raise


# A terminate storm (hundreds of jobs stopped at once, each with its armed standby) had ~400 running
# containers force-removed at once, and once Docker 20.10 stopped answering for some of them
# (docs/decisions.md, "A terminate storm"). Celery's threads bound the calls of control tasks; a
# follower is a thread per running instance, so its removal at the end (nothing waits for it: the
# end was decided before) takes one of a few slots of its engine per process. Not a control
# task's: one waiting for a slot would hold a Celery thread that a stop or a start needs.
_removal_slots: dict[str, threading.BoundedSemaphore] = {}
_removal_slots_lock = threading.Lock()


def _removal_slot(container) -> threading.BoundedSemaphore:
    from django.conf import settings

    key = container.client.api.base_url
    with _removal_slots_lock:
        slot = _removal_slots.get(key)
        if slot is None:
            slot = _removal_slots[key] = threading.BoundedSemaphore(settings.ENGINE_CLEAR_UPS_AT_ONCE)
        return slot


def clear_away(container) -> None:
    """remove_container for a follower's clear-up after its instance ended: at most
    ENGINE_CLEAR_UPS_AT_ONCE of them per engine and process at a time. The wait for a slot is a
    wait at the edge too: the thread's pooled connection goes back first (in a terminate storm 200
    followers waiting for a slot held the pool's 20, and stops and decisions waited on them)."""
    release_connection_if_pooled()
    with _removal_slot(container):
        remove_container(container)


class LogStream:
    """The container's log as Docker frames (`<timestamp> <payload>`), following it. Read by one
    thread; `close()` may come from another (it closes the socket, which ends the read). Errors
    while reading come out as the console's (Unreachable when the stream broke).

    Read in blocks (`batches()`: the lists of frames that arrived together), not a frame at a time as the
    SDK reads them (two reads through urllib3 per frame): a follower's cost per line was mostly
    the SDK's framing, at 200 followers or in a burst of a million lines."""

    def __init__(self, response, frames: Iterator[list[bytes]], *, errors_raised: bool = False):
        # The SDK's wrapper: close() from another thread shuts the socket down; a broken stream
        # (the host went away) ends the iteration, and the follower asks the engine why.
        # errors_raised: a read that fails or breaks off raises instead (the rest of an ended
        # container's log, which nobody closes from elsewhere: its end is the whole of it).
        self._response = response
        self._stream = docker.types.CancellableStream(frames, response)
        self._frames = frames if errors_raised else self._stream

    def batches(self) -> Iterator[list[bytes]]:
        with _edge():
            yield from self._frames

    def close(self) -> None:
        try:
            self._stream.close()
        except OSError:  # the engine reset the connection already (ENOTCONN): let go of it
            try:
                self._response.close()
            except OSError:
                pass


LOG_REST_TIMEOUT_S = 30  # follow=False: each wait for the engine (the answer, each read of it)


@_at_edge
def log_stream(container, *, since: float = 0, follow: bool = True) -> LogStream:
    """Follow the container's log from `since` (epoch seconds; 0: from its first line); follow=False:
    what it holds now (an ended container's rest), the stream ends there, and a wait for the
    engine longer than LOG_REST_TIMEOUT_S raises NoAnswerInTime (whatever the handle's client)."""
    api = container.client.api
    params = {"stdout": 1, "stderr": 1, "timestamps": 1, "follow": int(follow), "tail": "all"}
    if since > 0:
        params["since"] = since
    bound = {} if follow else {"timeout": LOG_REST_TIMEOUT_S}
    response = api._get(api._url("/containers/{0}/logs", container.id), params=params, stream=True, **bound)
    api._raise_for_status(response)
    if follow:
        # As the SDK does for a followed log: no read timeout (a quiet job is not a broken
        # stream). Not for the rest of an ended container's log: all of it is there already,
        # and an engine that stops sending it held the follower's thread (no heartbeat) for good.
        api._disable_socket_timeout(api._get_raw_response_socket(response))
    return LogStream(response, frames_in_blocks(response), errors_raised=not follow)


# -- container spec parts ------------------------------------------------------------------------------
Mount = docker.types.Mount  # what a mount of a container spec is (a dict the SDK sends as is)


def bind_mount(target: str, source: str, *, read_only: bool = False) -> docker.types.Mount:
    return docker.types.Mount(target, source, type="bind", read_only=read_only)


def volume_mount(
    target: str,
    volume: str,
    *,
    labels: dict[str, str] | None = None,
    read_only: bool = False,
    nfs: dict[str, str] | None = None,
) -> docker.types.Mount:
    """A named volume, created on first use; never filled with the image's files (an image with
    millions of them at the target would make the create time out). nfs: the local driver's
    options (type, o, device) to mount an export when the container starts."""
    return docker.types.Mount(
        target,
        volume,
        type="volume",
        read_only=read_only,
        labels=labels,
        no_copy=True,
        driver_config=docker.types.DriverConfig("local", options=nfs) if nfs else None,
    )


def local_log_config(*, max_size: str, max_files: int) -> docker.types.LogConfig:
    """Docker's local log driver: keeps every byte (json-file replaces invalid UTF-8), bounded."""
    return docker.types.LogConfig(
        type="local", config={"max-size": max_size, "max-file": str(max_files), "compress": "false"}
    )


def gpu_request(count: int) -> docker.types.DeviceRequest:
    return docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])
