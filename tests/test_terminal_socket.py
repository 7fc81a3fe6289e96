"""The instance terminal's websocket (jobs/terminal.py) against the real daphne, Celery worker
and Docker: a shell as uid 1000 in a running job's container, for those who may see the job,
only while the instance runs, recorded as an event."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from websockets.exceptions import ConnectionClosed

from jobs.models import EventKind, JobEvent, TaskRun
from jobs.runtime import stop
from jobs.terminal import CLOSE_ENDED, CLOSE_FORBIDDEN, CLOSE_TOO_MANY
from tests.helpers import running_instance, submit_job, wait_for
from tests.wsclient import Shell, open_socket, refused

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker")]

MARKER = "terminal-marker-file"


def running_job(demo, **fields):
    job = submit_job(demo, name="term-job", command=f"touch /job-data/{MARKER}; sleep 300", **fields)
    running_instance(job)
    return job


def path(job, index: int = 0) -> str:
    return f"/ws/jobs/{job.id}/terminal/{index}/"


def test_the_owner_gets_a_shell_as_uid_1000_and_it_is_recorded(demo, live_url):
    job = running_job(demo)
    with open_socket(live_url, path(job), demo.owner) as ws:
        shell = Shell(ws)
        shell.resize(33, 101)
        shell.type("ls /job-data; id -u; stty size; echo done-$((6*7))\r")
        out = shell.read_until(b"done-42").decode(errors="replace")
    assert MARKER in out
    lines = [line.strip() for line in out.splitlines()]
    assert "1000" in lines, out  # the job's user, not root
    assert "33 101" in lines, out  # the TTY has the browser's size
    event = wait_for(lambda: JobEvent.objects.filter(job=job, kind=EventKind.TERMINAL_OPENED).first())
    assert event.data["user"] == "owner" and event.data["instance"] == 0
    assert "owner" in event.message and "worker-0" in event.message


def test_a_member_who_may_see_the_job_gets_one_and_an_outsider_is_refused(demo, live_url):
    job = running_job(demo)
    assert refused(live_url, path(job), demo.outsider) == ("close", CLOSE_FORBIDDEN)
    assert refused(live_url, path(job)) in (("http", 403), ("close", CLOSE_FORBIDDEN))  # anonymous
    with open_socket(live_url, path(job), demo.member) as ws:
        shell = Shell(ws)
        shell.type("echo member-$((1+1))\r")
        shell.read_until(b"member-2")
    assert not JobEvent.objects.filter(job=job, kind=EventKind.TERMINAL_OPENED, data__user="outsider").exists()


def test_an_instance_that_does_not_run_is_refused(demo, live_url):
    job = running_job(demo)
    assert refused(live_url, path(job, index=1)) in (("http", 403), ("close", CLOSE_FORBIDDEN))
    ended = submit_job(demo, name="ended-job", command="echo bye")
    wait_for(lambda: TaskRun.objects.filter(attempt__job=ended, state=TaskRun.State.EXITED).exists(), timeout=60)
    for not_running in (path(job, index=1), path(ended)):  # no such instance; an instance that ended
        with open_socket(live_url, not_running, demo.owner) as ws:
            shell = Shell(ws)
            assert shell.closed_code(timeout=10) == CLOSE_FORBIDDEN
        # Said to those who may see the job.
        assert shell.texts == [{"ended": "the instance is not running", "code": CLOSE_FORBIDDEN}]


def test_the_terminal_closes_when_the_job_is_stopped(demo, live_url, docker_client):
    job = running_job(demo)
    with open_socket(live_url, path(job), demo.owner) as ws:
        shell = Shell(ws)
        shell.type("echo ready-$((2+3))\r")
        shell.read_until(b"ready-5")
        stop.request_terminate(job.id)
        assert shell.closed_code(timeout=30) == CLOSE_ENDED
    assert shell.texts and "ended" in shell.texts[-1]


def test_leaving_hangs_up_the_shell_and_what_it_started(demo, live_url, docker_client):
    """Docker leaves an exec with a TTY running when its connection closes: the console hangs
    up the terminal's session itself, so a closed page leaves no shell in the job's container."""
    job = running_job(demo)
    with open_socket(live_url, path(job), demo.owner) as ws:
        shell = Shell(ws)
        shell.type("sleep 4242 & echo started-$((3+4))\r")
        shell.read_until(b"started-7")
    run = TaskRun.objects.get(attempt__job=job, index=0)
    container = docker_client.containers.get(run.container_id)

    def left() -> str:
        return container.exec_run(["/.console/bin/busybox", "ps", "-o", "user,args"]).output.decode()

    wait_for(lambda: "sleep 4242" not in left() and "sh -i" not in left(), timeout=15, message="the shell hung up")
    assert "sleep 300" in left()  # the job itself runs on


def test_one_user_holds_only_so_many_terminals_at_once(demo, live_url):
    """CONSOLE_SESSIONS_PER_USER is 3 in the tests (tests/pytest_env.py); a user of their own, so
    that no other test's sockets count."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create(username="many-terminals")
    demo.workspace.members.add(user)
    job = running_job(demo)

    def shell_for(who, n: int) -> tuple[object, Shell]:
        ws = open_socket(live_url, path(job), who)
        shell = Shell(ws)
        shell.type(f"echo open-$((100+{n}))\r")
        return ws, shell

    with ExitStack() as held:
        for n in range(3):
            ws, shell = shell_for(user, n)
            held.enter_context(ws)
            shell.read_until(f"open-{100 + n}".encode())
        with open_socket(live_url, path(job), user) as ws:
            extra = Shell(ws)
            assert extra.closed_code(timeout=10) == CLOSE_TOO_MANY
        assert "as many as one may" in extra.texts[-1]["ended"]
        assert extra.texts[-1]["code"] == 4429  # said before the close frame too (the page's fallback)
        ws, other = shell_for(demo.owner, 7)  # another user's count is their own
        with ws:
            other.read_until(b"open-107")

    def opens_again() -> bool:  # the closed ones are given back (at the server's disconnect)
        try:
            ws, shell = shell_for(user, 9)
            with ws:
                shell.read_until(b"open-109", timeout=10)
                return True
        except (AssertionError, ConnectionClosed):
            return False

    wait_for(opens_again, timeout=20, message="a terminal once the others were closed")
