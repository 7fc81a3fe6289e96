"""Pushing to websockets (console/realtime.py) against the real Redis channel layer: a batch of
messages asks once who listens, and only groups with a member get a group_send."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from console import realtime

pytestmark = pytest.mark.skipif(
    not isinstance(get_channel_layer(), RedisChannelLayer), reason="the Redis channel layer (production mode)"
)


def group(name: str) -> str:
    return f"joblog.test-{uuid.uuid4().hex[:8]}.{name}"


def test_only_groups_with_a_member_are_sent_to(monkeypatch):
    watched, unwatched, left = group("watched"), group("unwatched"), group("left")

    async def scenario() -> tuple[set[str] | None, list[str], dict]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(watched, channel)
        await layer.group_add(left, channel)
        await layer.group_discard(left, channel)  # a page that was closed
        listened = await realtime._groups_listened(layer, {watched, unwatched, left})

        sent: list[str] = []
        group_send = layer.group_send

        async def recording(name, message):
            sent.append(name)
            await group_send(name, message)

        monkeypatch.setattr(layer, "group_send", recording)
        queue: asyncio.Queue = asyncio.Queue()
        for name in (unwatched, watched, left):
            queue.put_nowait((name, {"type": "log.lines", "group": name}))
        sender = asyncio.create_task(realtime._sender(queue))
        try:
            received = await asyncio.wait_for(layer.receive(channel), timeout=5)
        finally:
            sender.cancel()
            await layer.group_discard(watched, channel)
        return listened, sent, received

    listened, sent, received = asyncio.run(scenario())
    assert listened == {watched}
    assert sent == [watched], "no group_send to a group nobody listens to"
    assert received["group"] == watched
