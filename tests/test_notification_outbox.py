"""The notification outbox (docs/decisions.md, "Notifications: an outbox"): a notification is a
row the reconcile step queues again until it is sent or given up, so neither a broker that is
down when the event is recorded nor a message the broker loses drops it, and two deliveries of
the same row send it once.

The outage is real and private: a redis-server of this test on a port of its own, a Celery worker
process of its own consuming from it, and this process queueing through it. The suite's Redis is
shared by the sessions that run side by side, so it is never stopped.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from console.celery import app as celery_app
from console.worker_argv import worker_argv
from jobs import events, tasks
from jobs.models import EventKind, Notification, Phase, TrainingJob
from jobs.runtime import reconcile
from tests.helpers import BUSYBOX, wait_for
from tests.processes import ManagedProcess, free_port

# Rows must be committed: the worker process and the delivering threads read them.
pytestmark = [pytest.mark.django_db(transaction=True)]


class Receiver:
    """A webhook endpoint on 127.0.0.1 (CONSOLE_OUTBOUND_ALLOW lets the tests post there) that
    records every POST; while `hold` is clear it keeps each request waiting before answering 200."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.arrived = threading.Event()
        self.hold = threading.Event()
        self.hold.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                receiver.bodies.append(body)
                receiver.arrived.set()
                receiver.hold.wait(30)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True, name="outbox-receiver").start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/outbox"

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


class PrivateRedis:
    """A redis-server of this test alone, without persistence: stopped, what it held is lost,
    as a broker that crashed; started again on the same port, it is the broker coming back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="outbox-redis-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        log = open(Path(self.dir, "redis.log"), "ab")
        self.proc = subprocess.Popen(argv + ["--dir", self.dir], stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=10, message="the private redis-server")

    def _answers(self) -> bool:
        try:
            return redis.Redis.from_url(self.url, socket_timeout=1).ping()
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """SIGKILL: the broker is gone at once, with every message it held."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def queued(self, queue: str) -> int:
        return redis.Redis.from_url(self.url, socket_timeout=1).llen(queue)


@pytest.fixture
def private_broker():
    """A private Redis, and this process's Celery app publishing to it (the on-commit queueing
    of events.record and the reconcile step's, both run here)."""
    broker = PrivateRedis()
    broker.start()
    saved_url = celery_app.conf.get("broker_write_url")
    saved_pools = celery_app._pool, celery_app.amqp._producer_pool
    celery_app.conf.broker_write_url = broker.url
    # The app caches its connection and producer pools on first use: new ones, for the new URL.
    celery_app._pool = celery_app.amqp._producer_pool = None
    try:
        yield broker
    finally:
        if celery_app._pool is not None:
            celery_app._pool.force_close_all()
        celery_app.conf.broker_write_url = saved_url
        celery_app._pool, celery_app.amqp._producer_pool = saved_pools
        broker.stop()
        shutil.rmtree(broker.dir, ignore_errors=True)


class PrivateWorker(ManagedProcess):
    """A worker process whose readiness is read from its log since its latest start (the log
    is appended to across restarts)."""

    def start(self) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.ready = lambda: b" ready." in self.log_path.read_bytes()[offset:]
        super().start()


@pytest.fixture
def outbox_worker(private_broker):
    """A Celery worker process consuming the session's task queue on the private broker (the
    name is the session's, so that what this process routes there is what it takes; no other
    process uses that broker). No beat: the test runs the reconcile step itself, here."""
    name = f"outbox-worker-{private_broker.port}"
    argv = worker_argv([settings.CELERY_TASK_DEFAULT_QUEUE], concurrency=4, extra=("--hostname", f"{name}@%h"))
    # `env` execs the worker in the same process (group): ManagedProcess stops it as usual.
    worker = PrivateWorker(name, ["env", f"REDIS_URL={private_broker.url}", *argv])
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def queued(monkeypatch) -> list[int]:
    """For the tests without a worker: what would be queued is noted, not sent to the session's
    broker (a worker of the session would deliver it beside the test)."""
    ids: list[int] = []
    monkeypatch.setattr(tasks.deliver_notification, "delay", ids.append)
    return ids


def quiet_job(demo, hook: str) -> TrainingJob:
    """A job row that only carries events: already Failed and never ended, so that no reconcile
    step of a worker of the session schedules, stops or cleans it up."""
    return TrainingJob.objects.create(
        workspace=demo.workspace,
        created_by=demo.owner,
        name="outbox",
        image=BUSYBOX,
        command="echo hi",
        phase=Phase.FAILED,
        notify_webhook_url=hook,
        notify_events=["failed"],
    )


def record_failed(job: TrainingJob) -> Notification:
    """Record the job's failure as the runtime does (in its transaction) and return the one
    notification it made."""
    with transaction.atomic():
        event = events.record(job, EventKind.FAILED, "Failed: exit code 3.", exit_code=3)
    (notification,) = Notification.objects.filter(event=event)
    return notification


# -- across a broker outage ------------------------------------------------------------------------
@pytest.mark.integration
def test_a_notification_recorded_while_the_broker_is_down_is_sent_once_when_it_is_back(
    demo, private_broker, outbox_worker, receiver, caplog, monkeypatch, celery_worker_process
):
    # The suite's worker runs this step too (after its own FIRST_TRY_GRACE_S) and its broker is up:
    # it could send the notification while this test's broker is down. Only the outbox worker sends
    # here; the next test that needs the suite's worker starts it again.
    celery_worker_process.stop()
    # The step leaves a first try to its commit-time message this long; here that message is lost
    # for certain, so a second is enough (the step runs in this process).
    monkeypatch.setattr(reconcile, "FIRST_TRY_GRACE_S", 1)
    job = quiet_job(demo, receiver.url)
    private_broker.stop()

    with caplog.at_level(logging.WARNING, logger="jobs.events"):
        notification = record_failed(job)  # commits, and the queueing fails: not into the caller
    assert "could not queue 1 notification(s)" in caplog.text
    assert (notification.status, notification.tries) == (Notification.Status.PENDING, 0)

    # The reconcile step, while the broker is still down: it cannot queue either, and says so.
    with caplog.at_level(logging.WARNING, logger="jobs.runtime.reconcile"):
        refused = f"could not queue notification {notification.id}"
        wait_for(
            lambda: not reconcile.resend_notifications() and refused in caplog.text,
            timeout=15,
            message="the step to try while the broker is down",
        )
    assert receiver.bodies == []

    private_broker.start()  # empty: nothing was queued
    wait_for(lambda: queued_again(notification), timeout=15, message="the step to queue the notification")
    wait_for(
        lambda: Notification.objects.get(id=notification.id).status == Notification.Status.SENT,
        timeout=45,
        message="the worker, reconnected, to send it",
    )
    notification.refresh_from_db()
    assert (notification.tries, notification.last_error, notification.claimed_until) == (1, "", None)
    assert [(body["event"], body["job"]["id"]) for body in receiver.bodies] == [("failed", str(job.id))]
    assert not reconcile.resend_notifications()  # nothing pending is left to send again


@pytest.mark.integration
def test_a_message_the_broker_lost_with_its_worker_is_sent_again(demo, private_broker, outbox_worker, receiver):
    """The worker dies, the message waits in the broker, the broker dies too (no persistence):
    the row alone remembers the notification."""
    outbox_worker.kill()
    job = quiet_job(demo, receiver.url)
    notification = record_failed(job)
    assert private_broker.queued(settings.CELERY_TASK_DEFAULT_QUEUE) == 1  # queued at commit
    private_broker.stop()
    private_broker.start()
    assert private_broker.queued(settings.CELERY_TASK_DEFAULT_QUEUE) == 0  # and lost
    outbox_worker.start()

    # After the step's real grace for the first try's message.
    wait_for(
        lambda: queued_again(notification), timeout=reconcile.FIRST_TRY_GRACE_S + 10, message="the step to queue it"
    )
    wait_for(
        lambda: Notification.objects.get(id=notification.id).status == Notification.Status.SENT,
        timeout=30,
        message="the worker to send it",
    )
    assert [body["event"] for body in receiver.bodies] == ["failed"]


def queued_again(notification) -> bool:
    """The reconcile step queued the notification again: here, or in the worker's own reconcile
    (it may run first), which a worker then picks up (the row is no longer plain pending)."""
    if reconcile.resend_notifications():
        return True
    row = Notification.objects.get(id=notification.id)
    return row.status != Notification.Status.PENDING or row.claimed_until is not None or row.tries > 0


# -- the claim -------------------------------------------------------------------------------------
def deliver_in_thread(notification_id: int, results: list) -> threading.Thread:
    def run() -> None:
        try:
            results.append(tasks.deliver_notification(notification_id))
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=run, name="deliver")
    thread.start()
    return thread


def test_two_deliveries_of_one_notification_at_once_send_it_once(demo, receiver, queued, monkeypatch):
    """What two workers given the same row do (the commit-time message and the step's, say):
    the first holds it while it sends; the second, meanwhile, does nothing."""
    monkeypatch.setattr(reconcile, "FIRST_TRY_GRACE_S", 0)
    notification = record_failed(quiet_job(demo, receiver.url))
    assert queued == [notification.id]
    receiver.hold.clear()  # the first send stays in flight until the second delivery is over
    first: list[bool] = []
    thread = deliver_in_thread(notification.id, first)
    assert receiver.arrived.wait(15), "the first delivery's POST"

    assert tasks.deliver_notification(notification.id) is False
    assert not reconcile.resend_notifications() and queued == [notification.id]  # held: not queued again
    receiver.hold.set()
    thread.join(15)
    assert first == [True]
    notification.refresh_from_db()
    assert (notification.status, notification.tries, notification.claimed_until) == (Notification.Status.SENT, 1, None)
    assert len(receiver.bodies) == 1
    assert tasks.deliver_notification(notification.id) is False  # sent: never again


def test_a_claim_whose_holder_died_is_taken_over_when_it_runs_out(demo, receiver, queued, monkeypatch):
    monkeypatch.setattr(reconcile, "FIRST_TRY_GRACE_S", 0)
    notification = record_failed(quiet_job(demo, receiver.url))
    held_until = timezone.now() + timezone.timedelta(seconds=60)
    Notification.objects.filter(id=notification.id).update(claimed_until=held_until)
    assert tasks.deliver_notification(notification.id) is False  # its holder may still be sending
    assert not reconcile.resend_notifications() and receiver.bodies == []

    Notification.objects.filter(id=notification.id).update(claimed_until=timezone.now() - timezone.timedelta(seconds=1))
    assert reconcile.resend_notifications() and queued == [notification.id] * 2  # at commit, then by the step
    assert tasks.deliver_notification(notification.id) is True
    assert len(receiver.bodies) == 1
