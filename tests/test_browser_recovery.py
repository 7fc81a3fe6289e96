"""The Fault recovery and Events tabs as a user sees them: a real Chromium against the
real daphne, Celery worker, PostgreSQL, Redis and Docker of the test harness.

One job fails in two different ways and then completes while its page stays open:
the recovery rows, the timeline and the events arrive over the websocket, without a
reload. A second, made-up job with 30 attempts checks that the page stays readable.
Screenshots go to test-artifacts/ (gitignored).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import Page, expect

from faulttolerance.models import RecoveryRecord
from jobs.models import Attempt, EventKind, JobEvent, Phase, TaskRun, TrainingJob
from jobs.runtime import lifecycle
from tests.browser_page import UI_TIMEOUT_MS, assert_not_reloaded, log_in, mark_document
from tests.helpers import BUSYBOX, submit_job, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
WIDE = {"width": 1280, "height": 900}
NARROW = {"width": 900, "height": 900}

# Driven by the attempt number; each attempt waits for the test's go-N file in the
# job's data directory (/job-data), so the page is watching before anything happens.
COMMAND = (
    'wait_go() { until [ -e "/job-data/go-$1" ]; do sleep 0.1; done; }; '
    'echo "attempt $MA_ATTEMPT"; '
    'case "$MA_ATTEMPT" in '
    '1) echo "[checkpoint] no checkpoint, starting from step 0"; echo "[progress] step=5"; wait_go 1; '
    'echo "NCCL watchdog: collective operation timeout after 1800000 ms"; exit 1 ;; '
    '2) echo "[checkpoint] saved step=10"; echo "[progress] step=12"; echo "waiting to be killed"; '
    "exec sleep 100000 ;; "
    '*) echo "[checkpoint] resumed from step=10"; wait_go 3; echo "[progress] step=20"; echo "training done" ;; '
    "esac"
)


COUNT_SOCKET_MESSAGES = """
window.__socketMessages = 0;
document.addEventListener("htmx:wsAfterMessage", () => { window.__socketMessages += 1; });
"""


@pytest.fixture
def new_page(browser, live_url):
    """A page in a fresh browser context at 1280x900 that counts the job socket's messages (this
    module's own, in place of conftest's); closed after the test."""
    contexts = []

    def make() -> Page:
        context = browser.new_context(base_url=live_url, viewport=WIDE)
        context.set_default_timeout(UI_TIMEOUT_MS)
        context.add_init_script(COUNT_SOCKET_MESSAGES)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


def wait_for_socket(page: Page) -> None:
    """The job socket's first message has been swapped in (it re-renders the live parts)."""
    page.wait_for_function("window.__socketMessages > 0")


def shot(page: Page, name: str, full_page: bool = True) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


def go(job: TrainingJob, attempt: int) -> None:
    """Let the given attempt of the job go on (its container waits for this file)."""
    directory = Path(settings.JOB_DATA_ROOT) / str(job.id)
    wait_for(directory.exists, message="the job's data directory")
    (directory / f"go-{attempt}").touch()


def running_run(job: TrainingJob, number: int) -> TaskRun | None:
    return (
        TaskRun.objects.filter(attempt__job=job, attempt__number=number, state=TaskRun.State.RUNNING)
        .exclude(container_id="")
        .first()
    )


def no_horizontal_overflow(page: Page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def table_fits(page: Page, table_id: str) -> bool:
    """The table needs no horizontal scrolling inside its card."""
    return page.evaluate(
        "id => { const w = document.getElementById(id).parentElement; return w.scrollWidth <= w.clientWidth; }",
        table_id,
    )


def readable_at_narrow(page: Page, table_id: str) -> list[str]:
    """What is wrong with the recovery table at this width: its evidence column narrower than
    200 px (a matched line then wraps a word a line), or a cell whose content runs out of it."""
    return page.evaluate(
        """id => {
            const table = document.getElementById(id), wrong = [];
            const evidence = table.querySelector("thead th:nth-child(3)").getBoundingClientRect().width;
            if (evidence < 200) wrong.push(`evidence column ${Math.round(evidence)} px`);
            for (const cell of table.querySelectorAll("tbody td"))
                if (cell.scrollWidth > cell.clientWidth + 1)
                    wrong.push(`${cell.className} ${cell.scrollWidth} > ${cell.clientWidth} px: ${cell.innerText}`);
            return wrong;
        }""",
        table_id,
    )


def test_recoveries_timeline_and_events_arrive_live(demo, new_page, docker_client):
    page = new_page()
    log_in(page, "owner", "owner-password")
    job = submit_job(demo, name="recovery-demo", command=COMMAND, fault_tolerance=True, max_restarts=3)

    page.goto(f"/jobs/{job.id}/")
    mark_document(page)
    page.get_by_role("link", name="Fault recovery").click()
    expect(page.get_by_role("link", name="Fault recovery")).to_have_class(re.compile(r"\bactive\b"))
    header = page.locator("#job-header")
    expect(header.locator(".phase")).to_have_attribute("data-phase", "Running")
    rows = page.locator("#recovery-table tr.recovery-row")
    lanes = page.locator("#timeline g.tl-attempt")
    expect(page.locator("#recovery-table")).to_contain_text("No recoveries.")
    expect(lanes).to_have_count(1)
    expect(lanes.first).to_have_attribute("data-outcome", "running")
    expect(page.locator("#restarts")).to_have_text("Restarts 0/3")
    expect(page.locator("#hang-restarts")).to_have_text("Hang restarts 0")
    expect(page.locator("#reschedulings")).to_have_text("Reschedulings 0")
    shot(page, "20-recovery-one-attempt")

    # Attempt 1: an NCCL timeout, exit 1 -> transient, the process restarts in the same container.
    go(job, 1)
    expect(rows).to_have_count(1)
    first = rows.first
    expect(first).to_have_attribute("data-class", "transient")
    expect(first).to_have_attribute("data-level", "process")
    expect(first.locator(".tag")).to_have_text("transient")
    expect(first.locator(".level")).to_have_text("process level")
    expect(first).to_contain_text("exit code 1")
    expect(first).to_contain_text("worker-0 on local")
    expect(first.locator("pre.matched")).to_contain_text("NCCL watchdog: collective operation timeout")
    expect(first.locator(".ev-lost")).to_have_text("Work lost: 5 steps since the last checkpoint")
    expect(first.locator(".counters-after")).to_contain_text("Restarts 1/3")
    expect(page.locator("#restarts")).to_have_text("Restarts 1/3")
    expect(page.locator("#recovery-count")).to_have_text("1")
    expect(lanes).to_have_count(2)

    # Attempt 2: SIGKILLed from outside -> transient again, now at container level.
    second_run = wait_for(lambda: running_run(job, 2), message="attempt 2 to run")
    first_run = TaskRun.objects.get(attempt__job=job, attempt__number=1)
    assert second_run.container_id == first_run.container_id  # a process-level restart
    wait_for(lambda: TaskRun.objects.get(id=second_run.id).log_lines >= 4, message="attempt 2's log")
    docker_client.containers.get(second_run.container_id).kill()
    expect(rows).to_have_count(2)
    newest, oldest = rows.nth(0), rows.nth(1)  # newest first
    expect(newest).to_have_attribute("data-attempt", "2")
    expect(newest).to_have_attribute("data-class", "transient")
    expect(newest).to_have_attribute("data-level", "container")
    expect(newest).to_contain_text("exit code 137")
    expect(newest.locator(".ev-lost")).to_have_text("Work lost: 2 steps since the last checkpoint")
    expect(newest.locator(".counters-after")).to_contain_text("Restarts 2/3")
    expect(oldest).to_have_attribute("data-attempt", "1")
    expect(oldest).to_have_attribute("data-level", "process")
    expect(page.locator("#restarts")).to_have_text("Restarts 2/3")
    expect(lanes).to_have_count(3)
    expect(page.locator("#timeline g.tl-marker")).to_have_count(2)
    expect(newest.locator("td").nth(5)).not_to_have_text("–")  # running again at
    third_run = wait_for(lambda: running_run(job, 3), message="attempt 3 to run")
    assert third_run.container_id != second_run.container_id  # a container-level restart
    expect(lanes.nth(2)).to_have_attribute("data-outcome", "running")
    expect(header.locator(".phase")).to_have_attribute("data-phase", "Running")
    shot(page, "21-recovery-two-rows-live")
    assert table_fits(page, "recovery-table")  # every column, "Time lost" with its work lost, at 1280 px

    # Events tab: live as well; attempt 3 completes while it is open.
    events_tab = page.get_by_role("link", name="Events")
    events_tab.click()
    expect(events_tab).to_have_class(re.compile(r"\bactive\b"))
    assert "?tab=events" in page.url
    events = page.locator("#event-table tr.event-row")
    expect(events).to_have_count(3)
    go(job, 3)
    expect(events).to_have_count(4)
    kinds = [events.nth(i).get_attribute("data-kind") for i in range(4)]
    assert kinds == ["completed", "restarted", "restarted", "started"], kinds
    expect(events.nth(1)).to_contain_text("Attempt 3 running (container level).")
    expect(events.nth(2)).to_contain_text("Attempt 2 running (process level).")
    expect(events.first.locator(".tag")).to_have_text("completed")
    expect(header.locator(".phase")).to_have_attribute("data-phase", "Completed")
    shot(page, "22-events-live")

    page.get_by_role("link", name="Fault recovery").click()
    expect(lanes).to_have_count(3)
    expect(lanes.nth(0)).to_have_attribute("data-outcome", "failed")
    expect(lanes.nth(1)).to_have_attribute("data-level", "process")
    expect(lanes.nth(2)).to_have_attribute("data-level", "container")
    expect(lanes.nth(2)).to_have_attribute("data-outcome", "succeeded")
    expect(page.locator("#timeline .tl-labels text")).to_have_text(["#1initial", "#2process", "#3container"])
    expect(page.locator("#restarts")).to_have_text("Restarts 2/3")
    assert_not_reloaded(page)
    shot(page, "23-recovery-completed")

    page.set_viewport_size(NARROW)
    expect(lanes).to_have_count(3)
    assert no_horizontal_overflow(page)
    assert table_fits(page, "recovery-table")
    assert not (wrong := readable_at_narrow(page, "recovery-table")), "\n".join(wrong)
    shot(page, "24-recovery-narrow")

    page.set_viewport_size(WIDE)
    page.goto("/")
    row = page.locator("#job-table tr", has=page.get_by_role("link", name="recovery-demo"))
    expect(row.locator(".phase")).to_have_text("Completed")
    expect(row.locator("td.num-restarts")).to_have_text("2/3")
    expect(row.locator("td.num-hang")).to_have_text("0")
    expect(row.locator("td.num-resched")).to_have_text("0")
    shot(page, "25-job-list-counters")


STACKS = """Thread 0x7F3A2C1B5740 (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    step (train.py:141)
    main (train.py:188)
    <module> (train.py:201)
"""


def make_history(demo, attempts: int) -> TrainingJob:
    """A failed job with many attempts and every kind of recovery row, written directly
    (no containers): what a long-lived, unlucky job leaves behind."""
    t0 = timezone.now() - timedelta(hours=1)
    job = TrainingJob.objects.create(
        workspace=demo.workspace,
        created_by=demo.owner,
        name="long-history",
        image=BUSYBOX,
        command="python3 train.py",
        node_count=2,
        fault_tolerance=True,
        max_restarts=30,
        hang_restart=True,
        pod_retry_num=8,
        phase=Phase.FAILED,
        phase_reason="user_error (exit code 1): The training script raised an exception (Python traceback). "
        "Decision: end: user_error is not retryable.",
        created_at=t0,
        started_at=t0 + timedelta(seconds=4),
        ended_at=t0 + timedelta(seconds=60 * (attempts - 1) + 55),
    )
    JobEvent.objects.create(job=job, kind=EventKind.STARTED, at=job.started_at, message="Started on local.")
    # (class, level of the restart, exit code, OOM, matched lines), in turn.
    cycle = [
        ("transient", "process", 1, False, ["NCCL watchdog: collective operation timeout after 1800000 ms"]),
        ("hang", "process", None, False, []),
        ("resource_error", "container", 137, True, []),
        ("node_failure", "reschedule", None, False, []),
        # What the job printed, as matched: one unbroken token of 600 characters (a base64 blob, a
        # path) must wrap inside the evidence column, not widen the table at 900 px.
        ("transient", "job", 137, False, ["NCCL error: unhandled system error " + "QUJD" * 150]),
    ]
    made = []
    level = "initial"
    for n in range(1, attempts + 1):
        begin = t0 + timedelta(seconds=60 * (n - 1))
        attempt = Attempt.objects.create(
            job=job,
            number=n,
            level=level,
            state=Attempt.State.ENDED,
            outcome=Attempt.Outcome.FAILED,
            created_at=begin,
            started_at=begin + timedelta(seconds=4),
            ended_at=begin + timedelta(seconds=55),
        )
        for index in range(2):
            TaskRun.objects.create(
                attempt=attempt,
                index=index,
                host=demo.host,
                container_name=f"long-history-{n}-{index}",
                container_id=f"{n:04x}{index:02x}" + "ab" * 29,
                state=TaskRun.State.EXITED,
                started_at=attempt.started_at,
                ended_at=attempt.ended_at,
                exit_code=1,
            )
        if n > 1:
            JobEvent.objects.create(
                job=job,
                kind=EventKind.RESTARTED,
                at=attempt.started_at,
                message=f"Attempt {n} running ({level} level).",
            )
        made.append(attempt)
        level = cycle[(n - 1) % len(cycle)][1]

    restarts = hangs = moves = 0
    for n, attempt in enumerate(made, start=1):
        last = n == attempts
        failure_class, level, code, oom, lines = cycle[(n - 1) % len(cycle)]
        if last:
            failure_class, level, code, oom = "user_error", "", 1, False
            lines = ["Traceback (most recent call last):", "ValueError: learning rate must be positive, got -0.1"]
        evidence = {"work_lost_steps": 40 + n}
        if failure_class == "hang":
            evidence["hang"] = {"idle_for_s": 1800.4, "window_s": 1800, "cpu_cores_used": 0.0012, "gpu_util_percent": 0}
            evidence["stacks"] = STACKS
            hangs += 1
            JobEvent.objects.create(
                job=job,
                kind=EventKind.SUSPECTED_HANG,
                at=attempt.ended_at,
                message="worker-1 looks stuck: no CPU use, no log output, no GPU use for 1800.4 s (window 1800 s).",
            )
        elif failure_class == "node_failure":
            moves += 1
        elif not last:
            restarts += 1
        following = None if last else made[n]
        decision = "end: user_error is not retryable" if last else f"restart ({level} level): retryable"
        RecoveryRecord.objects.create(
            job=job,
            failed_attempt=attempt,
            detected_at=attempt.ended_at,
            failure_class=failure_class,
            rule="made-up",
            explanation=f"A made-up {failure_class.replace('_', ' ')} for the layout check.",
            task_index=n % 2,
            exit_code=code,
            oom_killed=oom,
            matched_lines=lines,
            evidence=evidence,
            restart=not last,
            level=level,
            decision=decision,
            restarts_used_after=restarts,
            max_restarts=30,
            hang_restarts_after=hangs,
            reschedules_after=moves,
            next_attempt=following,
            running_again_at=following.started_at if following else None,
        )
    JobEvent.objects.create(job=job, kind=EventKind.FAILED, at=job.ended_at, message=job.phase_reason)
    TrainingJob.objects.filter(id=job.id).update(
        restarts_used=restarts, hang_restarts_used=hangs, reschedules_used=moves
    )
    return job


def test_thirty_attempts_stay_readable(demo, new_page):
    job = make_history(demo, 30)
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.goto(f"/jobs/{job.id}/?tab=recovery")
    wait_for_socket(page)
    lanes = page.locator("#timeline g.tl-attempt")
    expect(lanes).to_have_count(30)
    expect(page.locator("#timeline g.tl-marker")).to_have_count(30)
    expect(page.locator("#recovery-table tr.recovery-row")).to_have_count(30)
    expect(page.locator("#recovery-count")).to_have_text("30")
    # Lanes do not overlap and the plot stays inside its card.
    boxes = [lanes.nth(i).bounding_box() for i in (0, 1, 29)]
    assert boxes[0]["y"] + boxes[0]["height"] <= boxes[1]["y"] and boxes[1]["y"] < boxes[2]["y"]
    card = page.locator("#recoveries").bounding_box()
    plot = page.locator("#timeline .tl-plot").bounding_box()
    assert plot["x"] + plot["width"] <= card["x"] + card["width"]
    hang_row = page.locator("#recovery-table tr.recovery-row[data-class=hang]").first
    expect(hang_row.locator(".ev-hang")).to_contain_text("No progress for 1800.4 s (window 1800 s)")
    hang_row.locator("details.stacks summary").click()
    expect(hang_row.locator("details.stacks pre")).to_contain_text("all_reduce")
    # A change of the rows re-renders them over the socket; the stacks the user opened stay open.
    messages = page.evaluate("window.__socketMessages")
    record = job.recoveries.order_by("-id").first()
    RecoveryRecord.objects.filter(id=record.id).update(explanation=record.explanation + " (re-read)")
    lifecycle.announce(job.id)
    page.wait_for_function("n => window.__socketMessages > n", arg=messages)
    expect(hang_row.locator("details.stacks")).to_have_attribute("open", "")
    expect(page.locator("#recovery-table tr.recovery-row[data-class=resource_error]").first).to_contain_text(
        "OOM-killed"
    )
    expect(page.locator("#restarts")).to_have_text(re.compile(r"^Restarts \d+/30$"))
    expect(page.locator("#reschedulings")).to_have_text(re.compile(r"^Reschedulings \d+/8$"))
    shot(page, "26-recovery-thirty-attempts")
    page.set_viewport_size(NARROW)
    expect(lanes).to_have_count(30)
    assert no_horizontal_overflow(page)
    assert table_fits(page, "recovery-table")
    assert not (wrong := readable_at_narrow(page, "recovery-table")), "\n".join(wrong)
    # A class wraps after its underscore in the narrow column (user_ / error), not inside a word.
    assert page.locator(".recovery-row[data-class='user_error'] .tag").first.inner_html() == "user_<wbr>error"
    shot(page, "27-recovery-thirty-attempts-narrow")

    page.set_viewport_size(WIDE)
    page.get_by_role("link", name="Events").click()
    expect(page.locator("#event-table tr.event-row").first).to_have_attribute("data-kind", "failed")
    shot(page, "28-events-many")
