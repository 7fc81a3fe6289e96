"""The job page's websockets against a real daphne process, with real sessions, a real
Celery worker and Docker: who may connect, and what the page receives live."""

from __future__ import annotations

import re
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from jobs.models import Phase, TrainingJob
from tests.helpers import job_container, phase, submit_job, wait_for
from tests.wsclient import (
    CLOSE_FORBIDDEN,
    HEADER_PHASE,
    closed_within,
    connect,
    log_numbers,
    open_socket,
    refused,
    session_cookie,
    ws_url,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker")]


def make_job(demo, command: str, **fields) -> TrainingJob:
    return submit_job(demo, name="ws-job", command=command, **fields)


# -- who may connect ------------------------------------------------------------------------------
def test_anonymous_is_refused(demo, live_url):
    job = make_job(demo, "echo secret-output")
    for path in (f"/ws/jobs/{job.id}/", f"/ws/jobs/{job.id}/logs/0/"):
        how = refused(live_url, path)
        assert how in (("http", 403), ("close", CLOSE_FORBIDDEN)), how


def test_outsider_is_closed_with_4403(demo, live_url):
    """4403, not a failed handshake: the page's ws extension reconnects forever after a 1006."""
    job = make_job(demo, "echo secret-output")
    for path in (f"/ws/jobs/{job.id}/", f"/ws/jobs/{job.id}/logs/0/"):
        assert refused(live_url, path, demo.outsider) == ("close", CLOSE_FORBIDDEN)


def test_foreign_origin_is_refused(demo, live_url):
    job = make_job(demo, "echo hi")
    headers = {"Origin": "http://evil.example", "Cookie": f"sessionid={session_cookie(demo.owner)}"}
    with pytest.raises((InvalidStatus, ConnectionClosed)):
        with connect(ws_url(live_url, f"/ws/jobs/{job.id}/"), additional_headers=headers, open_timeout=10) as ws:
            ws.recv(timeout=10)


def test_a_member_removed_from_the_workspace_loses_the_open_sockets(demo, live_url):
    """Access is checked again while a page is open (settings.WS_ACCESS_RECHECK_S), not only at
    connect: a quiet job's page of a removed member closes with 4403, and so does the job list
    of a deactivated user."""
    from django.conf import settings

    job = make_job(demo, "echo one line; sleep 120")
    sockets = [
        open_socket(live_url, path, demo.member) for path in (f"/ws/jobs/{job.id}/", f"/ws/jobs/{job.id}/logs/0/")
    ]
    job_list = open_socket(live_url, "/ws/jobs/", demo.owner)
    try:
        for ws in sockets:
            ws.recv(timeout=10)  # connected and sent the page's state
        demo.workspace.members.remove(demo.member)
        for ws in sockets:
            assert closed_within(ws, 3 * settings.WS_ACCESS_RECHECK_S + 5) == CLOSE_FORBIDDEN
        type(demo.owner).objects.filter(pk=demo.owner.pk).update(is_active=False)
        assert closed_within(job_list, 3 * settings.WS_ACCESS_RECHECK_S + 5) == CLOSE_FORBIDDEN
    finally:
        for ws in [*sockets, job_list]:
            ws.close()


# -- the job header ------------------------------------------------------------------------------------
def header_phases(ws, until: str, timeout: float = 30) -> list[str]:
    """Phases of the job-header fragments received until one shows `until`."""
    phases: list[str] = []
    deadline = time.monotonic() + timeout
    while not phases or phases[-1] != until:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {until} header within {timeout}s; saw {phases}")
        message = ws.recv(timeout=remaining)
        found = HEADER_PHASE.search(message)
        if found:
            assert re.search(r'id="job-header" hx-swap-oob="true"', message), message[:300]
            phases.append(found.group(1))
    return phases


def test_owner_and_member_see_the_phase_change_live(demo, live_url):
    job = make_job(demo, "echo start; sleep 2; echo end", fault_tolerance=True, max_restarts=4)
    with open_socket(live_url, f"/ws/jobs/{job.id}/", demo.owner) as owner_ws:
        with open_socket(live_url, f"/ws/jobs/{job.id}/", demo.member) as member_ws:
            first = owner_ws.recv(timeout=10)
            assert 'id="job-header"' in first and "ws-job" in first
            assert "Restarts 0/4" in first
            owner_phases = [HEADER_PHASE.search(first).group(1)] + header_phases(owner_ws, "Completed")
            member_phases = header_phases(member_ws, "Completed")
    for phases in (owner_phases, member_phases):
        assert "Running" in phases, phases
        assert phases.index("Running") < phases.index("Completed")
        assert phases[-1] == "Completed"
    assert phase(job) == Phase.COMPLETED


# -- the log ---------------------------------------------------------------------------------------------
def test_log_socket_sends_the_tail_then_live_lines_in_order(demo, live_url):
    total = 300
    job = make_job(demo, f"for i in $(seq 1 {total}); do echo n=$i; sleep 0.01; done")
    messages: list[str] = []
    with open_socket(live_url, f"/ws/jobs/{job.id}/logs/0/", demo.member) as ws:
        initial = ws.recv(timeout=10)
        assert initial.startswith('<div id="log-lines" hx-swap-oob="innerHTML">')
        messages.append(initial)

        def last_line_arrived():
            messages.append(ws.recv(timeout=30))
            numbers = log_numbers(messages)
            return numbers and numbers[-1][0] >= total

        wait_for(last_line_arrived, timeout=60, interval=0, message="the last log line over the socket")
        wait_for(lambda: phase(job) == Phase.COMPLETED, message="Completed")
        # Anything still in flight would be a duplicate: drain it.
        while True:
            try:
                messages.append(ws.recv(timeout=1))
            except TimeoutError:
                break

    live = messages[1:]
    assert live, "no live messages"
    assert all(m.startswith('<div id="log-lines" hx-swap-oob="beforeend">') for m in live)
    assert log_numbers(live), "every line came in the initial swap: nothing was live"
    lines = log_numbers(messages)
    assert [n for n, _ in lines] == list(range(1, total + 1))
    assert [text for _, text in lines] == [f"n={i}" for i in range(1, total + 1)]
    assert "attempt 1" in "".join(messages)  # the separator naming the attempt

    # A new page after the end gets the whole log in its first message.
    with open_socket(live_url, f"/ws/jobs/{job.id}/logs/0/", demo.owner) as ws:
        tail = ws.recv(timeout=10)
        assert tail.startswith('<div id="log-lines" hx-swap-oob="innerHTML">')
        assert log_numbers([tail]) == [(i, f"n={i}") for i in range(1, total + 1)]
        assert "attempt 1" in tail
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1)


def test_log_socket_of_a_restarted_job_shows_both_attempts(demo, live_url, docker_client):
    command = 'echo attempt $MA_ATTEMPT; if [ "$MA_ATTEMPT" = 1 ]; then while true; do echo tick; sleep 0.1; done; fi'
    job = make_job(demo, command, fault_tolerance=True, max_restarts=1)
    with open_socket(live_url, f"/ws/jobs/{job.id}/logs/0/", demo.owner) as ws:
        messages = [ws.recv(timeout=10)]
        container = wait_for(lambda: job_container(docker_client, job.id), message="a running container")

        def seen(text):
            messages.append(ws.recv(timeout=30))
            return text in "".join(messages)

        wait_for(lambda: seen(">tick<"), timeout=30, interval=0, message="a live tick")
        container.kill()
        wait_for(lambda: seen(">attempt 2<"), timeout=30, interval=0, message="the second attempt's first line")
    html = "".join(messages)
    assert html.index("attempt 1 ·") < html.index(">attempt 2<")
    assert "attempt 2 ·" in html  # a separator before the second attempt's lines
    wait_for(lambda: phase(job) == Phase.COMPLETED, message="Completed")


def test_job_socket_sends_only_the_fragments_that_changed(demo, live_url):
    """A new event re-sends the events list and its count, not the header or the attempts;
    a change that changes nothing visible sends nothing (but the running timeline)."""
    from jobs import events
    from jobs.models import EventKind
    from jobs.runtime import lifecycle

    job = make_job(demo, "sleep 60")
    wait_for(lambda: phase(job) == Phase.RUNNING, message="the job to run")
    with open_socket(live_url, f"/ws/jobs/{job.id}/", demo.owner) as ws:
        first = ws.recv(timeout=10)
        for fragment in ('id="job-header"', 'id="attempts"', 'id="recoveries"', 'id="events"'):
            assert fragment in first, fragment
        while True:  # drain what the start itself still announces
            try:
                ws.recv(timeout=2)
            except TimeoutError:
                break

        def swapped(message: str) -> set[str]:
            return set(re.findall(r'id="([a-z-]+)"[^>]*hx-swap-oob', message))

        # Only the recovery timeline, whose axis runs to "now" while the job runs, may change.
        lifecycle.announce(job.id)
        try:
            assert swapped(ws.recv(timeout=2)) <= {"recoveries"}
        except TimeoutError:
            pass
        events.record(job, EventKind.SUSPECTED_HANG, "a test event nobody caused")
        lifecycle.announce(job.id)
        message = ws.recv(timeout=10)
        assert "a test event nobody caused" in message
        assert (
            {"events", "event-count"} <= swapped(message) <= {"events", "event-count", "recovery-count", "recoveries"}
        )
