"""A click is a press and a release on one element: what the server sends in between must not
move or replace that element (static/console/console.js, pressGuard). Real Chromium, daphne,
Redis channel layer; the socket's messages are real ones, caused by a real change of the job."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from console import realtime
from jobs.models import Phase, TrainingJob
from tests.browser_page import log_in, page_maker, press_and_hold
from tests.helpers import BUSYBOX

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Registered before the page's own scripts: counts every message that arrives, held or not.
COUNT_MESSAGES = (
    "window.__arrived = 0; window.__drawn = 0;"
    'document.addEventListener("htmx:wsBeforeMessage", () => { window.__arrived += 1; });'
    'document.addEventListener("htmx:wsAfterMessage", () => { window.__drawn += 1; });'
)


def an_ended_jobs_page(demo, new_page, name: str) -> tuple[TrainingJob, Page, int]:
    """The owner's page of a job that has ended (the worker leaves it alone: only the test changes
    it), once the socket's first message is drawn; and the count of messages arrived so far."""
    job = TrainingJob.objects.create(
        workspace=demo.workspace, created_by=demo.owner, name=name, image=BUSYBOX, phase=Phase.COMPLETED
    )
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.add_init_script(COUNT_MESSAGES)
    page.goto(f"/jobs/{job.id}/")
    page.wait_for_function("window.__drawn > 0")
    return job, page, page.evaluate("window.__arrived")


def change_the_job_and_tell_its_pages(job: TrainingJob, reason: str) -> None:
    """What a worker does when a job changes: the row, then the job group's message."""
    TrainingJob.objects.filter(id=job.id).update(phase_reason=reason)
    realtime.publish(realtime.job_group(job.id), {"type": "job.changed"})


def test_a_press_on_the_job_header_lands_though_the_socket_redraws_the_header_meanwhile(demo, new_page, live_url):
    job, page, arrived = an_ended_jobs_page(demo, new_page, "pressed")

    press_and_hold(page, page.locator("#job-header").get_by_role("link", name="Copy"))
    change_the_job_and_tell_its_pages(job, "changed while the link was held")
    page.wait_for_function(f"window.__arrived > {arrived}")
    # Held: the header (and the link under the pointer) is the one that was pressed.
    expect(page.locator("#job-header")).not_to_contain_text("changed while the link was held")
    page.mouse.up()
    expect(page.locator(".notice")).to_contain_text("Copied from pressed.")


def test_a_message_held_during_a_press_is_drawn_when_it_ends_and_later_ones_after_it(demo, new_page, live_url):
    job, page, arrived = an_ended_jobs_page(demo, new_page, "held")

    press_and_hold(page, page.locator("#job-header h1"))  # text, not a link: nothing to follow
    change_the_job_and_tell_its_pages(job, "first change")
    page.wait_for_function(f"window.__arrived > {arrived}")
    change_the_job_and_tell_its_pages(job, "second change")
    page.wait_for_function(f"window.__arrived > {arrived + 1}")
    expect(page.locator("#job-header")).not_to_contain_text("change")
    page.mouse.up()
    # Drawn in order: the last one stays.
    expect(page.locator("#phase-reason")).to_have_text("second change")
    drawn = page.evaluate("window.__drawn")
    change_the_job_and_tell_its_pages(job, "after the press")
    expect(page.locator("#phase-reason")).to_have_text("after the press")
    page.wait_for_function(f"window.__drawn > {drawn}")
    assert re.search(r"/jobs/[0-9a-f-]{36}/$", page.url)  # the press followed nothing


@pytest.fixture
def touch_page(browser, live_url):
    """Pages of a touch screen (a tap's click comes after its pointerup, not in its task)."""
    with page_maker(browser, live_url, has_touch=True) as make:
        yield make


def test_a_tap_on_the_job_header_lands_though_the_socket_redraws_the_header_meanwhile(demo, touch_page, live_url):
    """A finger held on Copy is a press like a mouse's. (This Chromium sends the tap's click soon
    enough that the guard's wait for a touch's click is not what this shows.)"""
    job, page, arrived = an_ended_jobs_page(demo, touch_page, "tapped")
    link = page.locator("#job-header").get_by_role("link", name="Copy")
    link.scroll_into_view_if_needed()
    box = link.bounding_box()
    finger = {"x": box["x"] + box["width"] / 2, "y": box["y"] + box["height"] / 2}
    cdp = page.context.new_cdp_session(page)
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [finger]})
    change_the_job_and_tell_its_pages(job, "changed under the finger")
    page.wait_for_function(f"window.__arrived > {arrived}")
    expect(page.locator("#job-header")).not_to_contain_text("changed under the finger")
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    expect(page.locator(".notice")).to_contain_text("Copied from tapped.")
