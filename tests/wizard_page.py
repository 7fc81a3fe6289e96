"""Walking the create wizard in a real Chromium: wait for htmx to be idle, find the visible step,
go to the next one. Shared by the wizard's browser tests."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.browser_page import ARTIFACTS

HTMX_BUSY = ".htmx-request, .htmx-swapping, .htmx-settling, .htmx-added"


def htmx_idle(page: Page) -> None:
    """Wait until htmx has swapped and settled: content it swapped in only reacts (hx-trigger)
    once htmx processed it, and an event fired before that sends nothing. The same holds for a
    page just loaded: htmx processes it on DOMContentLoaded, after its first paint (a scenario
    picked in between on a busy machine left the checklist as it was); "complete" comes after."""
    page.wait_for_function(f"() => document.readyState === 'complete' && !document.querySelector({HTMX_BUSY!r})")


def step(page: Page, title: str):
    """The visible step's section, once htmx is idle."""
    section = page.locator("section.step:not([hidden])")
    expect(section.get_by_role("heading", level=2)).to_contain_text(title)
    htmx_idle(page)
    return section


def next_step(page: Page, title: str):
    page.locator(".wizard-actions").get_by_role("button", name=re.compile(r"^(Next|Review)$")).click()
    return step(page, title)


def open_wizard(page: Page) -> None:
    page.get_by_role("navigation").get_by_role("link", name="Create training job").click()
    expect(page.get_by_role("heading", name="Create training job")).to_be_visible()
    step(page, "Training mode")


def shot(page: Page, name: str) -> None:
    """A full-page screenshot: test-artifacts/wizard-<name>.png."""
    page.screenshot(path=str(ARTIFACTS / f"wizard-{name}.png"), full_page=True)
