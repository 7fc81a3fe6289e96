"""The instance terminal in a real Chromium: the Terminal button of a running instance opens
xterm.js on the instance's shell; what is typed runs there; the page says when it ended."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from jobs.models import TaskRun
from jobs.runtime import stop
from tests.conftest import running_instance, submit_job, wait_for
from tests.test_browser import browser, log_in, new_page, shot  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MARKER = "checkpoint-from-the-job"


def test_terminal_runs_a_command_in_the_running_instance(demo, new_page):  # noqa: F811
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
