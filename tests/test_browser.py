"""The console as a user sees it: a real Chromium (Playwright) against the real
daphne, Celery worker, PostgreSQL, Redis and Docker of the test harness.

Screenshots of the key moments go to test-artifacts/ (gitignored). The fixtures `browser` and
`new_page` are in tests/conftest.py, what drives a page in tests/browser_page.py.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from jobs.consumers import CLOSE_FORBIDDEN
from jobs.models import Phase, TrainingJob
from tests.browser_page import assert_not_reloaded, log_in, mark_document, shot
from tests.helpers import BUSYBOX, job_container, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SLOW_COUNTER = "i=0; while true; do i=$((i+1)); echo step $i; sleep 0.2; done"
STEP_LINE = re.compile(r"^step (\d+)$")  # the job's own lines, not the platform's


def open_create_form(page: Page) -> None:
    page.get_by_role("navigation").get_by_role("link", name="Create training job").click()
    expect(page.get_by_role("heading", name="Create training job")).to_be_visible()


def go_to_step(page: Page, title: str):
    """Jump to a step of the create wizard with its step indicator; returns the step's section."""
    page.locator(".steps").get_by_role("button", name=re.compile(title)).click()
    section = page.locator("section.step:not([hidden])")
    expect(section.get_by_role("heading", level=2)).to_contain_text(title)
    return section


def step_numbers(page: Page) -> list[int]:
    texts = page.locator("#log-lines .ln").all_inner_texts()
    return [int(m.group(1)) for t in texts if (m := STEP_LINE.fullmatch(t.strip()))]


def test_create_watch_recover_and_stop_a_job(demo, new_page, docker_client):
    page = new_page()
    log_in(page, "owner", "owner-password")
    shot(page, "01-job-list-empty")

    open_create_form(page)  # the wizard: its steps are walked in tests/test_browser_wizard.py
    go_to_step(page, "Basic information").get_by_label("Name").fill("browser-job")
    training = go_to_step(page, "Training configuration")
    training.get_by_label("Image", exact=True).fill(BUSYBOX)
    training.get_by_label("Start command").fill(SLOW_COUNTER)
    ha = go_to_step(page, "High availability")
    ha.get_by_label("Fault tolerance (automatic restart)").check()
    ha.get_by_label("Max restarts").fill("2")
    shot(page, "02-create-form-filled")
    go_to_step(page, "Review and submit")
    page.get_by_role("button", name="Submit", exact=True).click()

    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    job = TrainingJob.objects.get(name="browser-job")
    assert page.url.endswith(f"/jobs/{job.id}/")
    assert (job.created_by, job.fault_tolerance, job.max_restarts) == (demo.owner, True, 2)
    mark_document(page)
    header = page.locator("#job-header")
    expect(header.get_by_role("heading", name="browser-job")).to_be_visible()
    expect(header.locator(".phase")).to_have_attribute("data-phase", "Running")
    expect(page.locator("#restarts")).to_have_text("Restarts 0/2")
    shot(page, "03-job-running")

    # Logs: the tail arrives, then new lines while we watch.
    page.get_by_role("link", name="Logs", exact=True).click()
    expect(page.get_by_role("link", name="Logs", exact=True)).to_have_class(re.compile(r"\bactive\b"))
    expect(page.get_by_role("link", name="Overview")).not_to_have_class(re.compile(r"\bactive\b"))
    step_lines = page.locator("#log-lines .ln").filter(has_text=STEP_LINE)
    expect(step_lines.first).to_be_visible()
    seen = len(step_numbers(page))
    wait_for(lambda: len(step_numbers(page)) >= seen + 5, timeout=15, message="more log lines to arrive live")
    numbers = step_numbers(page)
    assert numbers == list(range(1, len(numbers) + 1)), "log lines are shown once each, in order"
    assert "?tab=logs" in page.url
    shot(page, "04-logs-live")

    # Fault recovery: empty, then a transient row appears when the container is SIGKILLed.
    page.get_by_role("link", name="Fault recovery").click()
    recovery_rows = page.locator("#recovery-table tr.recovery-row")
    expect(page.locator("#recovery-table")).to_contain_text("No recoveries.")
    container = job_container(docker_client, job.id)
    container.kill()
    expect(recovery_rows).to_have_count(1)
    row = recovery_rows.first
    expect(row).to_have_attribute("data-class", "transient")
    expect(row.locator(".tag")).to_have_text("transient")
    expect(row).to_contain_text("exit code 137")
    expect(row).to_contain_text("1/2")
    expect(page.locator("#restarts")).to_have_text("Restarts 1/2")
    expect(header.locator(".phase")).to_have_attribute("data-phase", "Running")
    expect(row.locator("td").nth(5)).not_to_have_text("–")  # running again at
    shot(page, "05-recovery-row")

    # The log of the new attempt follows a separator, counting from 1 again.
    page.get_by_role("link", name="Logs", exact=True).click()
    expect(page.locator("#log-lines .log-sep").nth(1)).to_contain_text("attempt 2")
    expect(page.locator("#log-lines .log-sep").nth(1).locator("~ .ln").filter(has_text=STEP_LINE).first).to_have_text(
        "step 1"
    )
    shot(page, "06-logs-after-restart")

    # Stop: confirm, Terminating, then Terminated, still without a reload.
    page.get_by_role("link", name="Overview").click()
    page.once("dialog", lambda dialog: dialog.accept())
    header.get_by_role("button", name="Stop").click()
    expect(header.locator(".phase")).to_have_attribute("data-phase", "Terminated")
    expect(header.get_by_role("button", name="Stop")).to_have_count(0)
    expect(page.locator("#phase-reason")).to_have_text("Stopped by the user.")
    expect(page.locator("#restarts")).to_have_text("Restarts 1/2")
    shot(page, "07-terminated")
    page.get_by_role("link", name="Attempts").click()
    attempt_rows = page.locator("#attempt-table tr.attempt-row")
    expect(attempt_rows).to_have_count(2)
    expect(attempt_rows.nth(1)).to_contain_text("137")  # newest first: attempt 1 was SIGKILLed
    shot(page, "08-attempts")
    assert_not_reloaded(page)

    job.refresh_from_db()
    assert (job.phase, job.restarts_used) == (Phase.TERMINATED, 1)
    assert job.recoveries.count() == 1
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"label": f"console.job={job.id}"})
    )

    page.goto("/")
    row = page.locator("tr", has=page.get_by_role("link", name="browser-job"))
    expect(row.locator(".phase")).to_have_text("Terminated")
    expect(row).to_contain_text("1/2")
    shot(page, "09-job-list")


def test_an_outsider_gets_404_for_the_job_page(demo, new_page):
    job = TrainingJob.objects.create(
        workspace=demo.workspace, created_by=demo.owner, name="private", image=BUSYBOX, command="echo hi"
    )
    page = new_page()
    log_in(page, "outsider", "outsider-password")
    expect(page.get_by_role("link", name="private")).to_have_count(0)
    for url in (f"/jobs/{job.id}/", f"/jobs/{job.id}/?tab=logs", f"/jobs/{job.id}/logs/0/download/"):
        response = page.goto(url)
        assert response is not None and response.status == 404, url
    shot(page, "11-outsider-404")
    # Nor do the job's websockets answer: the handshake is refused before any message.
    page.goto("/")
    ws_base = page.url.replace("http://", "ws://").rstrip("/")
    for path in (f"/ws/jobs/{job.id}/", f"/ws/jobs/{job.id}/logs/0/"):
        outcome = page.evaluate(
            """url => new Promise(resolve => {
                const ws = new WebSocket(url);
                ws.onmessage = () => { resolve("message"); ws.close(); };
                ws.onclose = event => resolve(event.code);
            })""",
            ws_base + path,
        )
        assert outcome in (1006, CLOSE_FORBIDDEN), (path, outcome)
