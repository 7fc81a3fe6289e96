"""The instance terminal in a real Chromium: the Terminal button of a running instance opens
xterm.js on the instance's shell; what is typed runs there; the page says when it ended."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from jobs.models import TaskRun
from jobs.runtime import stop
from tests.browser_page import log_in, shot
from tests.helpers import running_instance, submit_job, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MARKER = "checkpoint-from-the-job"


def test_terminal_runs_a_command_in_the_running_instance(demo, new_page):
    job = submit_job(demo, name="terminal-demo", command=f"touch /job-data/{MARKER}; sleep 300")
    running_instance(job)
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.goto(f"/jobs/{job.id}/?tab=attempts")
    button = page.locator("#attempt-table").get_by_role("link", name="Terminal")
    expect(button).to_have_count(1)
    shot(page, "terminal-01-button")
    with page.context.expect_page() as opened:
        button.click()
    term = opened.value
    expect(term.locator("#terminal-status")).to_have_text("Connected.")
    expect(term.locator("#terminal .xterm-rows")).to_contain_text("$")  # the prompt
    term.locator("#terminal").click()
    term.keyboard.type("nvidia-smi || ls /job-data")
    term.keyboard.press("Enter")
    expect(term.locator("#terminal .xterm-rows")).to_contain_text(MARKER)
    term.keyboard.type("id -u")
    term.keyboard.press("Enter")
    expect(term.locator("#terminal .xterm-rows")).to_contain_text("1000")
    shot(term, "terminal-02-ls-job-data")

    stop.request_terminate(job.id)
    expect(term.locator("#terminal-status")).to_have_text("The instance ended: the terminal is closed.")
    shot(term, "terminal-03-ended")

    # A page opened on an instance that no longer runs says so and opens no socket.
    wait_for(lambda: not TaskRun.objects.filter(attempt__job=job, state=TaskRun.State.RUNNING).exists(), timeout=30)
    term.reload()
    expect(term.locator("#terminal-status")).to_contain_text("worker-0 is not running")


def test_a_terminal_beyond_the_users_bound_says_why(demo, new_page, live_url):
    """A user already holding as many terminals and SSH sessions as one may (3 in the tests,
    tests/pytest_env.py) opens another: the page says why it closed."""
    from contextlib import ExitStack

    from django.contrib.auth import get_user_model

    from tests.wsclient import Shell, open_socket

    user = get_user_model().objects.create_user("three-terminals", password="three-terminals-password")
    demo.workspace.members.add(user)
    job = submit_job(demo, name="terminal-bound", command="sleep 300")
    running_instance(job)
    with ExitStack() as held:
        for n in range(3):
            shell = Shell(held.enter_context(open_socket(live_url, f"/ws/jobs/{job.id}/terminal/0/", user)))
            shell.type(f"echo held-$((20+{n}))\r")
            shell.read_until(f"held-{20 + n}".encode())
        page = new_page()
        log_in(page, "three-terminals", "three-terminals-password")
        page.goto(f"/jobs/{job.id}/terminal/0/")
        expect(page.locator("#terminal-status")).to_have_text(
            "Closed: you have as many terminals and SSH sessions open as one may. Close one, then reload this page."
        )
        shot(page, "terminal-04-too-many")
