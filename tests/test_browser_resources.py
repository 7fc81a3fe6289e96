"""The Resources tab in a real Chromium: a real two-instance job's CPU and memory drawn by uPlot
from the samples the console took, updated while it runs (no reload), kept after it ended; the
empty state; and the GPU chart, which on this machine (no GPU) only fake samples can show.

Screenshots go to test-artifacts/resources-*.png."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from playwright.sync_api import Page, expect

from jobs.models import Attempt, Phase, ResourceSeries, TaskRun, TrainingJob
from jobs.runtime import resources, stop
from jobs.runtime.engine_stats import Usage
from jobs.runtime.hang import Sample
from tests.browser_page import assert_not_reloaded, log_in, mark_document, shot
from tests.helpers import BUSYBOX, PYTHON_IMAGE, submit_job, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# worker-0 busy 3 s then idle 3 s with 100 MB written; worker-1 the same with 40 MB.
WAVES = (
    "python3 -c \"import os, time; x = b'1' * ((100 if os.environ['VC_TASK_INDEX'] == '0' else 40) << 20)\n"
    'while True:\n  end = time.time() + 3\n  while time.time() < end: pass\n  time.sleep(3)"'
)


def chart_data(page: Page) -> dict:
    return json.loads(page.locator("#resource-data").text_content())


def points_shown(page: Page) -> int:
    return sum(len(i["t"]) for i in chart_data(page)["instances"])


def open_resources(page: Page, job) -> None:
    page.goto(f"/jobs/{job.id}/")
    page.locator("nav.tabs").get_by_role("link", name="Resources").click()
    expect(page.locator("#resources h2")).to_have_text("Resources")


def test_resources_tab_draws_a_running_jobs_samples_live(demo, new_page):
    job = submit_job(demo, name="resources-demo", image=PYTHON_IMAGE, command=WAVES, node_count=2)
    wait_for(
        lambda: ResourceSeries.objects.filter(task_run__attempt__job=job).count() == 2,
        timeout=90,
        message="both instances sampled",
    )
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_resources(page, job)
    mark_document(page)
    for metric in ("cpu", "memory"):
        expect(page.locator(f'#resource-charts figure[data-metric="{metric}"] canvas')).to_have_count(1)
    expect(page.locator('#resource-charts figure[data-metric="gpu"]')).to_have_count(0)  # no GPU flavor
    legend = page.locator('#resource-charts figure[data-metric="memory"] .u-legend')
    for name in ("worker-0", "worker-1"):
        expect(legend).to_contain_text(name)
    # The container's limit, named; not drawn while the use is far below it (it would flatten the lines).
    expect(page.locator('#resource-charts figure[data-metric="memory"] figcaption')).to_contain_text("limit 8192 MB")
    table = page.locator(".resource-table")
    expect(table.locator('tr[data-task="worker-0"]')).to_contain_text("cores")
    expect(table.locator('tr[data-task="worker-1"]')).to_contain_text("MB")

    # Live: new samples arrive in the open tab (htmx fetches #resource-live; the charts take them).
    seen = points_shown(page)
    wait_for(lambda: points_shown(page) >= seen + 6, timeout=90, interval=0.5, message="new points in the page")
    wait_for(lambda: len(chart_data(page)["instances"][0]["t"]) >= 8, timeout=90, interval=0.5, message="8 points")
    assert_not_reloaded(page)
    data = chart_data(page)
    memory0 = [v for v in data["instances"][0]["memory"] if v is not None]
    memory1 = [v for v in data["instances"][1]["memory"] if v is not None]
    assert max(memory0) >= 100 and max(memory1) >= 40 and max(memory1) < max(memory0)
    # Its busy seconds show: a sleeping Python uses under 0.01 of a core. Not "close to one core":
    # beside the rest of the suite on two CPUs a busy loop got 0.22 of one in a full run.
    assert max(v for v in data["instances"][0]["cpu"] if v is not None) >= 0.05
    assert data["memory_limit_mb"] and max(memory0) < data["memory_limit_mb"]
    # Hover the CPU chart: its legend gives each instance's value at that time.
    cpu = page.locator('#resource-charts figure[data-metric="cpu"] .u-over')
    box = cpu.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] / 2)
    expect(page.locator('#resource-charts figure[data-metric="cpu"] .u-legend')).to_contain_text("cores")
    shot(page, "resources-01-running")

    stop.request_terminate(job.id)
    wait_for(lambda: job.refresh_from_db() or job.is_final, timeout=60, message="the job to end")
    page.reload()  # the stored series, read back from the database after the end
    expect(page.locator('#resource-charts figure[data-metric="cpu"] canvas')).to_have_count(1)
    expect(page.locator("#resource-live")).not_to_have_attribute("hx-trigger", "every 2s")
    assert len(chart_data(page)["instances"][0]["t"]) >= 8
    shot(page, "resources-02-ended")


def test_resources_tab_empty_state(demo, new_page):
    job = submit_job(demo, name="never-ran", image="console/does-not-exist:1")
    wait_for(lambda: job.refresh_from_db() or job.is_final, timeout=60, message="the job to fail")
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_resources(page, job)
    expect(page.locator(".resource-empty")).to_contain_text("No resource samples were recorded")
    expect(page.locator("#resource-charts canvas")).to_have_count(0)
    shot(page, "resources-03-empty")


def test_gpu_chart_with_fake_gpu_samples(demo, new_page):
    """No GPU on this machine: the samples are made up (as a GpuSampler would give them) and go
    through the real recorder and writer; what is checked is that a GPU line appears."""
    job = TrainingJob.objects.create(
        workspace=demo.workspace,
        created_by=demo.owner,
        name="fake-gpu",
        image=BUSYBOX,
        node_count=2,
        phase=Phase.COMPLETED,
    )
    attempt = Attempt.objects.create(job=job, number=1, state=Attempt.State.ENDED, outcome="succeeded")
    writer = resources.ResourceWriter(every_s=3600)
    start = datetime.now(tz=UTC).timestamp() - 600
    for index in range(2):
        run = TaskRun.objects.create(
            attempt=attempt, index=index, host=demo.host, container_name=f"fake-{index}", state="exited"
        )
        row = ResourceSeries(
            task_run_id=run.id, origin=datetime.fromtimestamp(start, tz=UTC), step_s=10, memory_limit_kib=8 << 20
        )
        recorder = resources._Run(run.id, row, (0, start))
        cpu_ns = 0
        for i in range(1, 60):
            cpu_ns += (5 + 3 * index + (i % 7)) * 10**9
            gpu = 40.0 + 30 * index + (i % 5) * 5
            recorder.add(Sample(start + 10 * i, Usage(cpu_ns, (2000 + 30 * i + 500 * index) << 20), gpu))
        writer._runs.append(recorder)
    writer.flush()
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_resources(page, job)
    expect(page.locator('#resource-charts figure[data-metric="gpu"] canvas')).to_have_count(1)
    expect(page.locator(".resource-table th")).to_contain_text(["GPU now"])
    expect(page.locator('.resource-table tr[data-task="worker-1"]')).to_contain_text("%")
    shot(page, "resources-04-fake-gpu")
