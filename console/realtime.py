"""Pushing events to websocket consumers from any thread or process.

Workers publish after the database commit; consumers re-read the database (or
the persisted log) so a message only says "something changed".

Sends go through one long-lived event loop per process and are sent in order
by a single coroutine, so publishing never opens a new event loop per send and
never waits for the channel layer. With the in-memory layer (embedded mode) the
loop must be the web server's own loop: that layer is not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)

# How much longer than the channel layer's blocking receive a read on its connections may take.
READ_TIMEOUT_MARGIN_S = 1.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_queue: asyncio.Queue | None = None
_server_loop: asyncio.AbstractEventLoop | None = None


def use_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Embedded mode: publish on the web server's loop (in-memory layer)."""
    global _server_loop
    _server_loop = loop


# At most this many queued messages are sent after one look at who listens.
SEND_BATCH = 500


async def _sender(queue: asyncio.Queue) -> None:
    layer = get_channel_layer()
    while True:
        batch = [await queue.get()]
        while not queue.empty() and len(batch) < SEND_BATCH:
            batch.append(queue.get_nowait())
        try:
            listened = await _groups_listened(layer, {group for group, _ in batch})
        except Exception:  # cannot tell: send them all, as group_send would
            log.exception("asking who listens failed")
            listened = None
        for group, message in batch:
            if listened is not None and group not in listened:
                continue
            try:
                await layer.group_send(group, message)
            except Exception:  # a push is best effort: the database already has the data
                log.exception("group_send to %s failed", group)


async def _groups_listened(layer, groups: set[str]) -> set[str] | None:
    """Which of these groups have a member now: one pipeline of ZCARDs per Redis shard for a whole
    batch, where a group_send asks twice for each message (ZREMRANGEBYSCORE, ZRANGE). Most log
    groups of a worker's followers have nobody watching (200 instances, a few pages open): their
    messages are dropped here. None: another layer, send everything.

    Dropping is as safe as group_send's own look: a consumer joins its group, then reads the
    database or the log file, and a message is only published after its data was committed, so
    what a consumer that joined after this look misses, it reads. A member that expired but was
    not discarded yet only makes a group look listened (group_send then discards it)."""
    from channels_redis.core import RedisChannelLayer

    if not isinstance(layer, RedisChannelLayer) or not groups:
        return None
    by_shard: dict[int, list[str]] = {}
    for group in groups:
        by_shard.setdefault(layer.consistent_hash(group), []).append(group)
    listened: set[str] = set()
    for shard, names in by_shard.items():
        pipe = layer.connection(shard).pipeline(transaction=False)
        for group in names:
            pipe.zcard(layer._group_key(group))
        counts = await pipe.execute()
        listened.update(group for group, count in zip(names, counts, strict=True) if count)
    return listened


def _ensure_sender() -> tuple[asyncio.AbstractEventLoop, asyncio.Queue] | None:
    global _loop, _queue
    with _lock:
        if _loop is not None and not _loop.is_closed():
            return _loop, _queue
        layer = get_channel_layer()
        if layer is None:
            return None
        if isinstance(layer, InMemoryChannelLayer):
            if _server_loop is None:
                return None  # no web server in this process: nobody can be listening
            loop = _server_loop
        else:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="realtime-publisher", daemon=True).start()

        async def start() -> asyncio.Queue:
            queue: asyncio.Queue = asyncio.Queue()
            asyncio.get_running_loop().create_task(_sender(queue))
            return queue

        _queue = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
        _loop = loop
        return _loop, _queue


def publish(group: str, message: dict[str, Any]) -> None:
    """Queue a group_send; returns at once."""
    sender = _ensure_sender()
    if sender is None:
        return
    loop, queue = sender
    loop.call_soon_threadsafe(queue.put_nowait, (group, message))


def job_group(job_id: Any) -> str:
    return f"job.{job_id}"


def log_group(job_id: Any, index: int) -> str:
    return f"joblog.{job_id}.{index}"


def workspace_group(workspace_id: Any) -> str:
    """The job lists of one workspace's members (each consumer filters by what its user may see)."""
    return f"jobs.workspace.{workspace_id}"


def redis_layer_timeouts() -> tuple[float, list[float | None]] | None:
    """The Redis channel layer's blocking receive (BZPOPMIN, seconds) and the socket timeout of
    each host's connections as redis-py really sets it (None: no timeout); None for another layer.

    The connections are built the way channels-redis builds them (its create_pool, then the
    pool's make_connection), without connecting: the value is the one every read will use,
    whatever the settings, the URL's query string or redis-py's defaults made of it.
    """
    from channels_redis.core import RedisChannelLayer

    layer = get_channel_layer()
    if not isinstance(layer, RedisChannelLayer):
        return None
    timeouts = [layer.create_pool(index).make_connection().socket_timeout for index in range(layer.ring_size)]
    return float(layer.brpop_timeout), timeouts


def check_layer_timeouts() -> None:
    """Refuse to serve websockets whose consumers would die whenever they wait.

    channels-redis waits for a consumer's next message with a BZPOPMIN of brpop_timeout seconds
    on a connection whose reads are bounded by the client's socket timeout. Unless that timeout
    is longer, an idle receive times out on the client (redis.exceptions.TimeoutError out of
    the consumer, close code 1011): with redis-py 8's default (5 s, equal to BZPOPMIN's) every
    websocket that received nothing for about 5 s.
    """
    timeouts = redis_layer_timeouts()
    if timeouts is None:
        return
    blocking, socket_timeouts = timeouts
    for socket_timeout in socket_timeouts:
        if socket_timeout is not None and socket_timeout < blocking + READ_TIMEOUT_MARGIN_S:
            raise ImproperlyConfigured(
                f"The Redis channel layer's socket timeout ({socket_timeout:g} s) must be at least "
                f"{READ_TIMEOUT_MARGIN_S:g} s longer than its blocking receive ({blocking:g} s): an idle "
                "websocket would be closed with 1011. Set CONSOLE_CHANNELS_REDIS_SOCKET_TIMEOUT_S "
                "(and no socket_timeout in REDIS_URL's query string)."
            )
