"""SPEC §3 "notifications" and §6 events: what a job's topic receives, against a real
HTTP receiver, a real Celery worker, real containers and Django's file e-mail backend."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError

from jobs.models import EventKind, JobEvent, Notification, Phase, TrainingJob
from jobs.runtime import stop
from tests.helpers import BUSYBOX, ended, job_container, reload, submit_job, wait_for

# A test that submits a job has the worker (transactional); the validation cases roll back.
pytestmark = [pytest.mark.django_db]
runs_jobs = pytest.mark.usefixtures("worker")


# -- a real webhook receiver ---------------------------------------------------------------------
class Receiver:
    """A webhook endpoint on 127.0.0.1 that records every POST and answers 500 for the first
    `fail_first` of them (or all of them while `failing` is set), 200 otherwise."""

    def __init__(self, fail_first: int = 0, failing: bool = False):
        self.fail_first, self.failing = fail_first, failing
        self.posts: list[dict] = []  # every POST, in arrival order: {"path", "body", "status"}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"unparsable": raw.decode(errors="replace")}
                with receiver.lock:
                    status = 500 if receiver.failing or len(receiver.posts) < receiver.fail_first else 200
                    receiver.posts.append(
                        {"path": self.path, "body": body, "status": status, "type": self.headers.get("Content-Type")}
                    )
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"receiver down")

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="webhook-receiver")
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/training"

    def delivered(self) -> list[dict]:
        """Bodies of the POSTs answered 200, in order."""
        with self.lock:
            return [p["body"] for p in self.posts if p["status"] == 200]

    def delivered_events(self) -> list[str]:
        return [body.get("event") for body in self.delivered()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(**kwargs) -> Receiver:
        made.append(Receiver(**kwargs))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


# -- helpers -------------------------------------------------------------------------------------
def make_job(demo, **fields) -> TrainingJob:
    return submit_job(demo, **(dict(name="notify") | fields))


def settled_notifications(job) -> list[Notification]:
    """The job's notifications once none is pending any more (sent or given up)."""
    wait_for(
        lambda: not Notification.objects.filter(event__job=job, status=Notification.Status.PENDING).exists(),
        timeout=30,
        message="every notification sent or given up",
    )
    return list(Notification.objects.filter(event__job=job).select_related("event").order_by("event__at", "id"))


def assert_payload(body: dict, job: TrainingJob, event: str, phase: str, used: int, max_restarts: int) -> None:
    assert body["event"] == event, body
    assert body["job"]["id"] == str(job.id) and body["job"]["name"] == job.name, body
    assert body["job"]["project_id"] == job.workspace.project_id, body
    assert body["job"]["phase"] == phase, (event, body)
    assert (body["job"]["restarts_used"], body["job"]["max_restarts"]) == (used, max_restarts), (event, body)
    assert body["message"] and body["at"], body
    # The event's id, the same on every delivery: how a receiver drops a repeat.
    assert JobEvent.objects.get(pk=body["event_id"]).job_id == job.id and body["event"] == event


# -- the webhook ---------------------------------------------------------------------------------
@runs_jobs
def test_webhook_receives_exactly_the_subscribed_events_in_order(demo, receivers, docker_client):
    hook = receivers()
    # Attempt 1 sleeps (and is suspected hung: an event nobody subscribed to) until it is
    # SIGKILLed from outside; attempt 2 waits for the test's go-ahead, then fails with R used up.
    job = make_job(
        demo,
        name="notify-webhook",
        fault_tolerance=True,
        max_restarts=1,
        hang_window_s=2,
        notify_webhook_url=hook.url,
        notify_events=["started", "restarted", "failed"],
        command='echo "attempt $MA_ATTEMPT"; if [ "$MA_ATTEMPT" = 1 ]; then exec sleep 100000; fi; '
        "while [ ! -f /job-data/go ]; do sleep 0.2; done; echo giving up; exit 3",
    )

    wait_for(lambda: hook.delivered_events() == ["started"], timeout=30, message="the started notification")
    assert_payload(hook.delivered()[0], job, "started", Phase.RUNNING, 0, 1)
    wait_for(lambda: job.events.filter(kind=EventKind.SUSPECTED_HANG).exists(), timeout=30, message="a suspected hang")

    # A real fault: the container is SIGKILLed behind the console's back.
    container = job_container(docker_client, job.id)
    container.kill()
    wait_for(lambda: len(hook.delivered()) == 2, timeout=30, message="the restarted notification")
    restarted = hook.delivered()[1]
    assert_payload(restarted, job, "restarted", Phase.RUNNING, 1, 1)
    assert restarted["data"]["level"] == "container" and restarted["data"]["attempt"] == 2

    Path(settings.JOB_DATA_ROOT, str(job.id), "go").touch()
    wait_for(lambda: ended(job), timeout=30, message="the job to fail")
    assert job.phase == Phase.FAILED, job.phase_reason
    notifications = settled_notifications(job)

    assert hook.delivered_events() == ["started", "restarted", "failed"]
    assert_payload(hook.delivered()[2], job, "failed", Phase.FAILED, 1, 1)
    assert all(p["status"] == 200 and p["path"] == "/hooks/training" for p in hook.posts)
    assert all(p["type"] == "application/json" for p in hook.posts)
    # Every event is stored; only the subscribed ones became notifications.
    kinds = set(job.events.values_list("kind", flat=True))
    assert {"started", "suspected_hang", "restarted", "failed"} <= kinds
    assert [(n.event.kind, n.transport, n.status, n.tries) for n in notifications] == [
        ("started", "webhook", "sent", 1),
        ("restarted", "webhook", "sent", 1),
        ("failed", "webhook", "sent", 1),
    ]


@runs_jobs
def test_events_not_subscribed_are_not_sent(demo, receivers):
    hook = receivers()
    subscribed = ["started", "failed"]
    completes = make_job(demo, name="notify-completes", notify_webhook_url=hook.url, notify_events=subscribed)
    stopped = make_job(
        demo, name="notify-stopped", notify_webhook_url=hook.url, notify_events=subscribed, command="sleep 100000"
    )
    wait_for(lambda: reload(stopped).phase == Phase.RUNNING, timeout=30, message="the second job to run")
    stop.request_terminate(stopped.id)
    wait_for(lambda: ended(completes) and ended(stopped), timeout=40, message="both jobs to end")
    assert (completes.phase, stopped.phase) == (Phase.COMPLETED, Phase.TERMINATED)
    assert completes.events.filter(kind=EventKind.COMPLETED).exists()
    assert stopped.events.filter(kind=EventKind.TERMINATED).exists()

    for job in (completes, stopped):
        assert [n.event.kind for n in settled_notifications(job)] == ["started"]
    sent = sorted((body["job"]["name"], body["event"]) for body in hook.delivered())
    assert sent == [("notify-completes", "started"), ("notify-stopped", "started")]
    assert len(hook.posts) == 2


@runs_jobs
def test_a_failing_receiver_gets_the_event_on_a_retry(demo, receivers):
    hook = receivers(fail_first=2)
    job = make_job(demo, name="notify-retry", notify_webhook_url=hook.url, notify_events=["completed"])
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    (notification,) = settled_notifications(job)
    assert (notification.status, notification.tries) == (Notification.Status.SENT, 3)
    assert notification.sent_at is not None and notification.last_error == ""
    assert [p["status"] for p in hook.posts] == [500, 500, 200]
    assert {p["body"]["event"] for p in hook.posts} == {"completed"}
    assert_payload(hook.delivered()[0], job, "completed", Phase.COMPLETED, 0, 0)


@runs_jobs
def test_a_receiver_that_always_fails_ends_failed_after_the_retries(demo, receivers):
    # Five retries with backoff CONSOLE_NOTIFY_BACKOFF_S * 1, 2, 4, 8, 16 (tests/pytest_env.py).
    hook = receivers(failing=True)
    job = make_job(demo, name="notify-down", notify_webhook_url=hook.url, notify_events=["completed"])
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    wait_for(
        lambda: not Notification.objects.filter(event__job=job, status=Notification.Status.PENDING).exists(),
        timeout=90,
        message="the notification to be given up",
    )
    (notification,) = Notification.objects.filter(event__job=job)
    assert (notification.status, notification.tries) == (Notification.Status.FAILED, 6)
    assert "HTTP 500" in notification.last_error and notification.sent_at is None
    assert [p["status"] for p in hook.posts] == [500] * 6


@runs_jobs
def test_a_late_delivery_describes_the_job_as_it_was_at_the_event(demo, receivers):
    hook = receivers(failing=True)
    job = make_job(demo, name="notify-late", notify_webhook_url=hook.url, notify_events=["started"])
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    assert job.phase == Phase.COMPLETED
    hook.failing = False  # the receiver comes back before the retries are used up
    (notification,) = settled_notifications(job)
    assert notification.status == Notification.Status.SENT
    assert hook.delivered()[0]["job"]["phase"] == Phase.RUNNING


@runs_jobs
def test_a_webhook_to_an_internal_address_is_refused_once_and_not_retried(demo):
    """169.254.169.254 is a cloud's metadata service: the worker does not post there (only the
    tests' loopback is allowed, tests/pytest_env.py), and gives up at once with the reason."""
    job = make_job(
        demo, name="notify-metadata", notify_webhook_url="http://169.254.169.254/latest/", notify_events=["completed"]
    )
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    (notification,) = settled_notifications(job)
    assert (notification.status, notification.tries) == (Notification.Status.FAILED, 1)
    assert "refused" in notification.last_error and "link-local" in notification.last_error


# -- e-mail --------------------------------------------------------------------------------------
@runs_jobs
def test_email_notification_is_written_by_the_mail_backend(demo):
    # The worker sends with Django's file backend into CONSOLE_EMAIL_FILE_PATH (tests/pytest_env.py).
    mail_dir = Path(os.environ["CONSOLE_EMAIL_FILE_PATH"])
    job = make_job(
        demo,
        name="notify-mail-job",
        notify_emails="ops@example.com, lead@example.com",
        notify_events=["completed"],
    )
    wait_for(lambda: ended(job), timeout=30, message="the job to end")
    notifications = settled_notifications(job)
    assert sorted((n.transport, n.target, n.status) for n in notifications) == [
        ("email", "lead@example.com", "sent"),
        ("email", "ops@example.com", "sent"),
    ]

    def messages() -> list[str]:
        files = mail_dir.glob("*.log") if mail_dir.is_dir() else []
        return [text for text in (f.read_text() for f in files) if "notify-mail-job" in text]

    found = wait_for(lambda: messages(), timeout=10, message="an e-mail file for the job")
    text = "\n".join(found)
    assert "Subject: [training console] notify-mail-job: Completed" in text
    assert "To: ops@example.com" in text and "To: lead@example.com" in text
    assert str(job.id) in text and "is Completed" in text
    assert not any("notify-mail-job: Started" in message for message in found)  # not subscribed


# -- validation ----------------------------------------------------------------------------------
def refused(demo, **fields) -> dict[str, list[str]]:
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name="notify-valid", image=BUSYBOX, **fields)
    job.command = "echo hi"
    with pytest.raises(ValidationError) as info:
        job.full_clean()
    return info.value.message_dict


@pytest.mark.parametrize(
    "fields, field, words",
    [
        pytest.param(
            dict(notify_webhook_url="http://127.0.0.1:9/hook", notify_events=["started", "exploded"]),
            "notify_events",
            ["notification events", "exploded"],
            id="unknown-event",
        ),
        pytest.param(dict(notify_events=["failed"]), "notify_events", ["topic", "webhook", "e-mail"], id="no-topic"),
        pytest.param(
            dict(notify_emails="ops@example.com, not-an-address", notify_events=["failed"]),
            "notify_emails",
            ["e-mail address", "not-an-address"],
            id="bad-email",
        ),
        pytest.param(
            dict(notify_emails="ops@example.com; lead@example.com", notify_events=["failed"]),
            "notify_emails",
            ["e-mail address"],
            id="semicolon-list",
        ),
    ],
)
def test_notification_settings_are_validated_naming_the_field(demo, fields, field, words):
    errors = refused(demo, **fields)
    assert field in errors, errors
    message = " ".join(errors[field]).lower()
    for word in words:
        assert word.lower() in message, message


def test_valid_notification_settings_pass(demo):
    job = TrainingJob(
        workspace=demo.workspace,
        created_by=demo.owner,
        name="notify-valid",
        image=BUSYBOX,
        command="echo hi",
        notify_webhook_url="https://hooks.example.com/training",
        notify_emails="ops@example.com, lead@example.com",
        notify_events=[str(kind) for kind in EventKind if kind in ("started", "completed", "failed", "suspected_hang")],
    )
    job.full_clean()
    # A topic without events is allowed (nothing is sent).
    TrainingJob(
        workspace=demo.workspace, created_by=demo.owner, name="quiet", image=BUSYBOX, command="echo hi"
    ).full_clean()
