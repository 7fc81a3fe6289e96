"""Prometheus metrics of a running job (jobs/runtime/metrics.py): scraped inside each
instance by the job's command or URL, shown on the Metrics tab and over the API.
Real containers: busybox (httpd, wget) and the Python image (no wget: the python3 fetch)."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import Attempt, TaskRun
from tests.helpers import PYTHON_IMAGE, api_client, submit_job, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker")]

WRITE_METRICS = (
    "mkdir -p /tmp/www; printf '# TYPE loss gauge\\nloss{phase=\"train\"} 0.5\\nstep_total 3\\n' > /tmp/www/metrics; "
)


def running(job):
    return wait_for(
        lambda: TaskRun.objects.filter(
            attempt__job=job, attempt__state=Attempt.State.RUNNING, state="running"
        ).exists(),
        message="the job to run",
    )


def scraped(demo, job, timeout: float = 30) -> dict:
    """The metrics API's answer once the first instance was scraped successfully."""

    def answer():
        body = api_client(demo.token).get(f"/v2/{demo.workspace.project_id}/training-jobs/{job.id}/metrics").json()
        return body if body["items"] and body["items"][0]["ok"] else None

    return wait_for(answer, timeout=timeout, message="a successful scrape")


def owner(demo) -> Client:
    client = Client()
    client.login(username="owner", password="owner-password")
    return client


def test_metrics_by_command_on_the_tab_and_the_api(demo):
    job = submit_job(
        demo,
        name="by-command",
        command=WRITE_METRICS + "sleep 60",
        metrics_mode="command",
        metrics_command="cat",
        metrics_args="/tmp/www/metrics",
    )
    running(job)
    body = scraped(demo, job)
    samples = body["items"][0]["samples"]
    assert {"name": "loss", "labels": {"phase": "train"}, "value": 0.5, "type": "gauge"} in samples
    html = owner(demo).get(f"/jobs/{job.id}/?tab=metrics").content.decode()
    assert "worker-0" in html and "<code>loss</code>" in html and "phase=&quot;train&quot;" in html and "0.5" in html
    assert 'href="?tab=metrics"' in html


def test_metrics_by_http_inside_a_container_without_network(demo):
    """network none: only the container's loopback reaches the port; busybox fetches with wget."""
    job = submit_job(
        demo,
        name="by-http",
        command=WRITE_METRICS + "httpd -f -p 127.0.0.1:9100 -h /tmp/www",
        metrics_mode="http",
        metrics_path="/metrics",
        metrics_port=9100,
    )
    running(job)
    body = scraped(demo, job)
    assert [s["name"] for s in body["items"][0]["samples"]] == ["loss", "step_total"]


def test_metrics_by_http_with_python_only(demo):
    job = submit_job(
        demo,
        name="by-http-python",
        image=PYTHON_IMAGE,
        command=WRITE_METRICS + "cd /tmp/www && python3 -m http.server 9101 --bind 127.0.0.1",
        metrics_mode="http",
        metrics_path="/metrics",
        metrics_port=9101,
    )
    running(job)
    body = scraped(demo, job, timeout=60)
    assert body["items"][0]["samples"][0]["name"] == "loss"


def test_a_failing_scrape_says_why_and_a_job_without_metrics_has_no_tab(demo):
    job = submit_job(
        demo, name="broken", command="sleep 60", metrics_mode="command", metrics_command="cat", metrics_args="/nope"
    )
    running(job)
    item = (
        api_client(demo.token).get(f"/v2/{demo.workspace.project_id}/training-jobs/{job.id}/metrics").json()["items"][0]
    )
    # Why: cat's own message, or, when the engine lost the output of an exec that ended at once
    # (moby/moby#27289: a full run got an empty stderr, 2026-12-03), its exit code.
    assert item["ok"] is False and "The metrics command 'cat' failed: " in item["error"]
    assert "/nope" in item["error"] or item["error"].endswith("failed: exit code 1")
    assert (
        "The metrics command &#x27;cat&#x27; failed" in owner(demo).get(f"/jobs/{job.id}/?tab=metrics").content.decode()
    )

    plain = submit_job(demo, name="plain", command="sleep 60")
    assert owner(demo).get(f"/jobs/{plain.id}/?tab=metrics").status_code == 404
    assert 'href="?tab=metrics"' not in owner(demo).get(f"/jobs/{plain.id}/").content.decode()
    response = api_client(demo.token).get(f"/v2/{demo.workspace.project_id}/training-jobs/{plain.id}/metrics")
    assert response.status_code == 404 and "exposes no Prometheus metrics" in response.json()["error_msg"]


@pytest.mark.browser
def test_the_metrics_tab_in_a_browser(demo, new_page):
    from playwright.sync_api import expect

    from tests.browser_page import ARTIFACTS, log_in

    job = submit_job(
        demo,
        name="metrics-page",
        command=WRITE_METRICS + "sleep 60",
        metrics_mode="command",
        metrics_command="cat",
        metrics_args="/tmp/www/metrics",
    )
    running(job)
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.goto(f"/jobs/{job.id}/")
    page.get_by_role("link", name="Metrics").click()
    table = page.locator("#metrics .metrics-instance[data-task=worker-0] table")
    expect(table).to_contain_text("loss")
    expect(table).to_contain_text("gauge")
    page.screenshot(path=str(ARTIFACTS / "metrics-tab.png"), full_page=True)
