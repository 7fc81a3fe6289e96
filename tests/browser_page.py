"""Driving Debian's Chromium (Playwright) against the harness's daphne: where the browser is, the
pages' timeout, fresh contexts (one user each), logging in, screenshots to test-artifacts/
(gitignored) and what a test asks a page (held presses, a page never reloaded). The `browser` and
`new_page` fixtures (tests/conftest.py) are made with these."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Page, expect

# Debian's Chromium headless shell: the same Blink and V8 as the full browser, without the
# browser's UI layer, and what Playwright itself launches for headless pages. Driven in the full
# browser's new headless mode, Chromium took 2.1x the CPU over the suite (docs/decisions.md, stop 47).
CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"
CHROMIUM_MISSING = (
    f"Chromium's headless shell is not installed at {CHROMIUM} "
    "(scripts/setup.sh --test installs it: apt-get install chromium-headless-shell)"
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
UI_TIMEOUT_MS = 30_000
expect.set_options(timeout=UI_TIMEOUT_MS)  # a stop waits up to 5 s for SIGTERM, then SIGKILLs


@contextmanager
def page_maker(browser, live_url: str, **options) -> Iterator[Callable[..., Page]]:
    """make(**more): a page in a fresh browser context (one user each), with these context
    options (a locale, a touch screen); every context is closed at the end."""
    contexts = []

    def make(**more) -> Page:
        context = browser.new_context(base_url=live_url, viewport={"width": 1280, "height": 860}, **(options | more))
        context.set_default_timeout(UI_TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    try:
        yield make
    finally:
        for context in contexts:
            context.close()


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def press_and_hold(page: Page, locator) -> None:
    """The pointer pressed on the middle of `locator` and held (page.mouse.up() releases it)."""
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()


def log_in(page: Page, username: str, password: str) -> None:
    # The requests that failed say why a login did not land: a full run once ended on Chromium's
    # error page with no POST in daphne's log (stop 48; net::ERR_NETWORK_CHANGED fits it, which is
    # why the browser has a network of its own now: tests/browser_network.py).
    failed: list[str] = []

    def note(request) -> None:
        failed.append(f"{request.method} {request.url}: {request.failure}")

    page.on("requestfailed", note)
    try:
        page.goto("/accounts/login/")
        page.get_by_label("User name").fill(username)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        try:
            expect(page.get_by_role("heading", name="Training jobs")).to_be_visible()
        except AssertionError as exc:
            raise AssertionError(f"{username} is not logged in: the page is {page.url}, failed: {failed}") from exc
    finally:
        page.remove_listener("requestfailed", note)


def mark_document(page: Page) -> None:
    """A marker that only survives while the page is never reloaded."""
    page.evaluate("window.__notReloaded = true")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"
