"""A follower's own calls to the engine are bounded (follow.FOLLOWER_CALL_TIMEOUT_S); its followed
log is not (a quiet job is not a broken stream: engine.log_stream turns that socket's timeout off).

With a client that waited for ever, an engine that answered its pings but not for one container (a
deadlocked engine, README "The engine's version") held the follower's thread in the look-up for
good; its heartbeat went stale, another follower took the run and was held the same way: a thread
more every staleness period."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.models import DockerHost, TaskRun
from jobs.runtime import follow
from tests.bounded_calls import Host, followed_through_a_bounded_client, running_run, serve_engine


def answered(body: bytes, content_type: str = "application/json") -> tuple[bytes, bool]:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body, False


@pytest.mark.django_db(transaction=True)
def test_a_look_up_the_engine_never_answers_gives_the_run_up_once_another_follower_took_it(tmp_path, demo, monkeypatch):
    monkeypatch.setattr(follow, "FOLLOWER_CALL_TIMEOUT_S", 1)
    path = tmp_path / "engine.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(16)
    looked_up = threading.Event()

    def route(request_line: str) -> tuple[bytes, bool]:
        target = request_line.split(" ")[1]
        if target.endswith("/_ping"):
            return answered(b"OK", "text/plain")
        if target == "/version":
            return answered(json.dumps({"ApiVersion": "1.41", "Version": "20.10.24"}).encode())
        looked_up.set()
        return b"", False  # the container's inspect: no answer, ever

    held = serve_engine(listener, route)
    try:
        host = DockerHost.objects.create(name="deadlocked", base_url=f"unix://{path}", pool=demo.pool)
        run = running_run(demo, host, "held")
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: outcome.append(follow.follow_task_run(run.id)), daemon=True)
        thread.start()
        assert looked_up.wait(10)
        # The suite's worker adopts runs whose heartbeat is FOLLOWER_STALE_AFTER_S old, and the
        # look-up does not beat: keep this run out of its reach (the follower asks its token only).
        out_of_reach = timezone.now() + timezone.timedelta(minutes=5)
        TaskRun.objects.filter(id=run.id).update(follower_heartbeat=out_of_reach)
        time.sleep(2.5)  # past a bounded look-up or two: it asked again, still the run's follower
        assert thread.is_alive()
        adopter = uuid.uuid4()  # its heartbeat went stale: another follower took the run
        TaskRun.objects.filter(id=run.id).update(follower_token=adopter, follower_heartbeat=out_of_reach)
        thread.join(15)
        assert not thread.is_alive(), "the follower's look-up waited on the engine without end"
        assert outcome == [False]
        run.refresh_from_db()
        assert run.follower_token == adopter and run.state == TaskRun.State.RUNNING  # the adopter's to follow
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_a_followed_log_outlives_its_clients_bound(docker_client):
    followed_through_a_bounded_client(Host(settings.DEFAULT_DOCKER_URL), docker_client)
