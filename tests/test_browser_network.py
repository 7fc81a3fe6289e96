"""The tests' browser in a network namespace of its own (tests/browser_network.py): the bridges the
engine makes and removes for multi-instance jobs neither appear there nor fail a page's requests.
Outside it, Chromium failed a request every second bridge or so with net::ERR_NETWORK_CHANGED, and a
full run of the suite once lost a login that way (stop 48)."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from tests.pytest_env import TEST_LABEL

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Sixteen loops fetch a static file again and again, uncached, until told to stop, and note what
# failed. Sixteen: more than Chromium's six connections to a server, so that requests are always
# waiting for a connection, which a network change fails (one on a connection already made it does not).
FETCH_LOOPS = """() => {
    window.probe = {done: 0, failed: [], stop: false};
    for (let loop = 0; loop < 16; loop++) {
        (async () => {
            while (!window.probe.stop) {
                try {
                    await fetch('/static/console/console.css?' + Math.random(), {cache: 'no-store'});
                    window.probe.done += 1;
                } catch (error) {
                    window.probe.failed.push(String(error));
                }
            }
        })();
    }
}"""


def interfaces(*netns: str) -> set[str]:
    """Interface names of the machine's network, or of the named namespace's (`-n`, name)."""
    out = subprocess.run(["ip", *netns, "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    return {line.split(": ")[1].split("@")[0] for line in out.splitlines()}


def test_the_engines_bridges_are_not_in_the_browsers_network_and_fail_none_of_its_requests(
    browser_network, new_page, docker_client
):
    assert interfaces("-n", browser_network.name) == {"lo", "online0", "online1"}
    page = new_page()
    page.goto("/accounts/login/")  # daphne, through the forwarders
    assert page.evaluate("navigator.onLine")
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(f"{request.url}: {request.failure}"))
    page.evaluate(FETCH_LOOPS)
    page.wait_for_function("window.probe.done > 0")
    for _ in range(6):
        network = docker_client.networks.create(
            f"browser-probe-{uuid.uuid4().hex[:8]}", internal=True, labels=dict([TEST_LABEL])
        )
        try:
            bridge = f"br-{network.id[:12]}"
            assert bridge in interfaces()  # the machine has it ...
            assert bridge not in interfaces("-n", browser_network.name)  # ... the browser does not
            page.wait_for_timeout(100)  # requests go on meanwhile
        finally:
            network.remove()
    page.wait_for_timeout(300)  # a failure of the last removal reaches the page
    done = page.evaluate("window.probe.stop = true; window.probe.done")
    assert failed == [], f"{len(failed)} requests failed, e.g. {failed[:3]}"
    assert page.evaluate("window.probe.failed") == []
    assert done > 10
