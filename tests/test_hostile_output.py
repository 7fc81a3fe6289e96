"""Nothing a job prints can fool, stall or escape the console (SPEC §8: output is arbitrary
bytes, kept and shown, never trusted). Real containers, the real worker, daphne and Chromium:
progress bars drawn with \\r and ESC[A, binary output, a 50 MB line without a newline and a
million lines in a burst are decided, persisted byte for byte, downloadable as printed, and
shown as a terminal would show them without the page or its socket drowning."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import time
from html import unescape

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.test import Client
from playwright.sync_api import expect

from console import realtime
from jobs import logstream
from jobs.consumers import PACE_S
from jobs.models import Phase, TaskRun, TrainingJob
from tests.browser_page import log_in, shot
from tests.helpers import BUSYBOX, PYTHON_IMAGE, api_log, job_container, running_instance, submit_job, wait_for
from tests.wsclient import CLOSE_FORBIDDEN, closed_within, connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker")]

# -- what the jobs print ------------------------------------------------------------------------------
BAR_SCRIPT = r"""
import sys, time
out = sys.stdout.buffer
time.sleep(2)  # the test's socket connects first
out.write(b"start\n"); out.flush()
for i in range(501):
    out.write(b"\r%3d%%|%-50s| %d/500" % (i * 100 // 500, b"#" * (i // 10), i)); out.flush()
    time.sleep(0.002)
out.write(b"\n")
out.write(b"\router   0%\n"); out.flush()
for j in range(1, 101):
    out.write(b"\rinner %3d%%\x1b[A\router %3d%%\n" % (j, j // 2)); out.flush()
    time.sleep(0.002)
out.write(b"\n\x1b[1;31mRuntimeError: boom\x1b[0m\n"); out.flush()
sys.exit(1)
"""


def bar_output() -> bytes:
    """Exactly what BAR_SCRIPT prints."""
    out = b"start\n"
    out += b"".join(b"\r%3d%%|%-50s| %d/500" % (i * 100 // 500, b"#" * (i // 10), i) for i in range(501)) + b"\n"
    out += b"\router   0%\n"
    out += b"".join(b"\rinner %3d%%\x1b[A\router %3d%%\n" % (j, j // 2) for j in range(1, 101))
    return out + b"\n\x1b[1;31mRuntimeError: boom\x1b[0m\n"


BAR_LINES = ["start", "100%|" + "#" * 50 + "| 500/500", "outer  50%", "inner 100%", "RuntimeError: boom"]

HUGE_TAIL = b"<END>"
HUGE_SIZE = 50 * 1024 * 1024
BINARY_SCRIPT = r"""
import sys, time
out = sys.stdout.buffer
time.sleep(2)  # the test's socket connects first
out.write(b"bin:\x00\x01\xff\xfe\xc3\x28 \x1b[32mgreen\x1b[0m \x1b]0;title\x07<b>&amp;\x7f end\n"); out.flush()
time.sleep(1)
block = b"0123456789abcdef" * 65536  # 1 MiB, no newline
for _ in range(50):
    out.write(block); out.flush()
time.sleep(1)
out.write(b"<END>\ndone\n"); out.flush()
"""


def binary_output() -> bytes:
    head = b"bin:\x00\x01\xff\xfe\xc3\x28 \x1b[32mgreen\x1b[0m \x1b]0;title\x07<b>&amp;\x7f end\n"
    return head + b"0123456789abcdef" * (HUGE_SIZE // 16) + HUGE_TAIL + b"\ndone\n"


def python_job(demo, name: str, script: str, **fields) -> TrainingJob:
    encoded = base64.b64encode(script.encode()).decode()
    return submit_job(demo, name=name, image=PYTHON_IMAGE, command=f"echo {encoded} | base64 -d | python3 -", **fields)


# -- a page's log, as the browser's DOM would hold it -----------------------------------------------------
PIECE = re.compile(
    r'<div class="log-sep" id="lr-(?P<sep>\d+)">'
    r'|<div class="ln" data-n="(?P<n>\d+)">(?P<html>.*?)</div>'
    r'|<div class="log-skip">(?P<skip>.*?)</div>',
    re.S,
)
REPLACE = re.compile(r'<div hx-swap-oob="innerHTML:#lr-(\d+)~\[data-n=\'(\d+)\'\][^"]*">(.*?)</div>', re.S)


class PageLog:
    """Applies the log socket's messages the way htmx does: the first replaces everything,
    later ones append lines and replace lines by (run, number)."""

    def __init__(self):
        self.lines: dict[tuple[int, int], str] = {}
        self.skips: list[str] = []
        self.run = 0
        self.received_lines = 0
        self.messages = 0

    def apply(self, message: str) -> None:
        self.messages += 1
        if message.startswith('<div id="log-lines" hx-swap-oob="innerHTML">'):
            self.lines.clear()
        body, marker, rest = message.partition('<div hx-swap-oob="innerHTML:')
        for piece in PIECE.finditer(body):
            if piece.group("sep"):
                self.run = int(piece.group("sep"))
            elif piece.group("n"):
                self.lines[(self.run, int(piece.group("n")))] = piece.group("html")
                self.received_lines += 1
            else:
                self.skips.append(text_of(piece.group("skip")))
        for run, number, html in REPLACE.findall(marker + rest):
            assert (int(run), int(number)) in self.lines, f"replacement of a line the page does not have: {number}"
            self.lines[(int(run), int(number))] = html

    def texts(self) -> list[str]:
        return [text_of(html) for html in self.lines.values()]


def text_of(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", html))


def socket(live_url: str, job: TrainingJob, user):
    client = Client()
    client.force_login(user)
    headers = {"Origin": live_url, "Cookie": f"sessionid={client.cookies['sessionid'].value}"}
    url = live_url.replace("http://", "ws://", 1) + f"/ws/jobs/{job.id}/logs/0/"
    return connect(url, additional_headers=headers, open_timeout=10, max_size=None)


def follow_until_final(ws, job: TrainingJob, page: PageLog, timeout: float = 180, last: str | None = None) -> None:
    """Apply the socket's messages until the job ended and nothing more came for 2 s; with `last`,
    until the page's last line is that too: a page that fell behind a burst may have been refused
    the last pushes, and reads the rest from the log at its next recheck."""
    deadline = time.monotonic() + timeout
    while not TrainingJob.objects.get(id=job.id).is_final:
        assert time.monotonic() < deadline, "the job did not end"
        try:
            page.apply(ws.recv(timeout=1))
        except TimeoutError:
            pass
    deadline = time.monotonic() + 3 * settings.WS_ACCESS_RECHECK_S + 10
    while True:  # what is still in flight
        try:
            page.apply(ws.recv(timeout=2))
        except TimeoutError:
            if last is None or (page.lines and page.texts()[-1] == last):
                return
            assert time.monotonic() < deadline, f"the page stayed at {page.texts()[-1:]}, not {last}"


def initial_page(live_url: str, job: TrainingJob, user) -> tuple[PageLog, str]:
    page = PageLog()
    with socket(live_url, job, user) as ws:
        message = ws.recv(timeout=20)
    page.apply(message)
    return page, message


def raw_download(demo, job: TrainingJob) -> bytes:
    response = api_log(demo, job)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    return b"".join(response.streaming_content)


# -- the tests ---------------------------------------------------------------------------------------
def test_a_progress_bar_job_that_fails_is_decided_kept_whole_and_shown_as_one_line(demo, live_url):
    job = python_job(demo, "bars", BAR_SCRIPT)
    live = PageLog()
    with socket(live_url, job, demo.owner) as ws:
        live.apply(ws.recv(timeout=20))
        follow_until_final(ws, job, live, timeout=90)
    job.refresh_from_db()
    assert job.phase == Phase.FAILED, job.phase_reason  # decided, not Running forever
    assert raw_download(demo, job) == bar_output()  # every byte, as printed

    # Live: 501 redraws of the bar and 100 of the nested bars, yet one line each, in their last state.
    assert live.texts() == BAR_LINES
    assert live.received_lines == len(BAR_LINES)
    assert '<span class="f1 bo">RuntimeError: boom</span>' in list(live.lines.values())[-1]
    # A page opened afterwards draws the same lines from the persisted log.
    after, _ = initial_page(live_url, job, demo.member)
    assert after.texts() == BAR_LINES and after.lines == live.lines


def test_a_bar_job_with_fault_tolerance_restarts_and_fails_with_every_byte_kept(demo, live_url):
    """The decision path reads the tail of a log full of \\r and escapes (as a terminal shows
    it: the traceback line is found under its colours), restarts per policy (unconditional
    restart: a user error too), then fails with both attempts' bytes kept."""
    script = BAR_SCRIPT.replace("time.sleep(2)", "pass")
    job = python_job(demo, "bars-ft", script, fault_tolerance=True, max_restarts=1, unconditional_restart=True)
    wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=120, message="the job to end")
    job.refresh_from_db()
    assert job.phase == Phase.FAILED and job.restarts_used == 1, (job.phase, job.phase_reason)
    assert "user_error" in job.phase_reason and "Python traceback" in job.phase_reason
    for run in TaskRun.objects.filter(attempt__job=job):
        assert run.log_lines > 0
    whole = raw_download(demo, job)
    assert whole.count(bar_output()) == 2  # both attempts' output, each whole
    page, _ = initial_page(live_url, job, demo.owner)
    texts = page.texts()
    assert texts.count(BAR_LINES[1]) == 2 and texts.count("RuntimeError: boom") == 2


def test_binary_output_and_a_50_mb_line_without_newline(demo, live_url):
    job = python_job(demo, "binary", BINARY_SCRIPT)
    live = PageLog()
    with socket(live_url, job, demo.owner) as ws:
        live.apply(ws.recv(timeout=20))
        wait_for(
            lambda: (run := TaskRun.objects.filter(attempt__job=job).first()) and run.log_bytes > 5 * 1024 * 1024,
            timeout=60,
            message="part of the huge line persisted",
        )
        # While the line grows, another page opens at once with the tail of the log: the huge
        # line, cut, saying how much more there is, and that the line before it is not shown.
        during, message = initial_page(live_url, job, demo.member)
        assert len(message) < 64 * 1024  # the page's first message is bounded, not the line
        [huge] = during.texts()
        assert huge.startswith("0123456789abcdef" * 125) and "more characters" in huge
        assert during.skips == ["1 line not shown here · download the full log"]
        follow_until_final(ws, job, live, timeout=180)

    job.refresh_from_db()
    assert job.phase == Phase.COMPLETED, job.phase_reason
    downloaded = raw_download(demo, job)
    expected = binary_output()
    assert len(downloaded) == len(expected)
    assert hashlib.sha256(downloaded).hexdigest() == hashlib.sha256(expected).hexdigest()

    hidden = f"… {HUGE_SIZE + len(HUGE_TAIL) - 2000:,} more characters"
    [first, huge, done] = live.texts()
    assert done == "done"
    assert first == "bin:^@^A\ufffd\ufffd\ufffd( green <b>&amp;^? end"
    html = list(live.lines.values())[0]
    assert '<span class="f2">green</span>' in html and "<b>" not in html  # shown as text, never markup
    assert huge.startswith("0123456789abcdef" * 125) and hidden in huge, huge[-80:]
    assert len(live.lines) == 3 and live.skips == []  # the long line stayed one line

    after, message = initial_page(live_url, job, demo.owner)
    assert len(message) < 64 * 1024
    assert after.texts() == [huge, "done"] and after.skips == ["1 line not shown here · download the full log"]


def test_output_without_a_final_newline_is_kept(demo, live_url):
    """Docker's follow stream can end before the entry written at the container's exit: the
    follower reads once more from its last line after the end (three jobs: it failed 1 in 2)."""
    jobs = [
        submit_job(demo, name=f"eof-{i}", command="echo first; printf 'no newline at the end'; sleep 1")
        for i in range(3)
    ]
    for job in jobs:
        wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=60, message="the job to end")
        assert raw_download(demo, job) == b"first\nno newline at the end"


def test_a_million_lines_are_all_persisted_and_the_page_is_not_sent_them_all(demo, live_url):
    total = 1_000_000
    job = submit_job(demo, name="burst", image=BUSYBOX, command=f"sleep 2; seq 1 {total}; sleep 1")
    live = PageLog()
    with socket(live_url, job, demo.owner) as ws:
        live.apply(ws.recv(timeout=20))
        followed = time.monotonic()
        follow_until_final(ws, job, live, timeout=300, last=str(total))
        followed = time.monotonic() - followed
    job.refresh_from_db()
    assert job.phase == Phase.COMPLETED, job.phase_reason
    run = TaskRun.objects.get(attempt__job=job)
    assert run.log_lines == total
    downloaded = raw_download(demo, job)
    assert downloaded == b"".join(b"%d\n" % i for i in range(1, total + 1))

    # In a burst the page gets at most the tail (TAIL_LINES) per PACE_S, plus what a trickle may
    # send before the burst is told apart: a rate, whatever the job prints and however long the
    # burst lasts on a busy machine.
    most = (followed / PACE_S + 2) * (logstream.TAIL_LINES + logstream.BURST_LINES)
    assert live.received_lines <= most, (live.received_lines, followed)
    assert live.received_lines < total // 2, (live.received_lines, followed)
    # Nothing is lost on the page either: every line was sent or counted in a marker.
    not_shown = sum(int(re.match(r"([\d,]+) lines? not shown", skip).group(1).replace(",", "")) for skip in live.skips)
    assert not_shown + live.received_lines == total, (not_shown, live.received_lines)
    assert live.texts()[-1] == str(total)  # the page ends where the job did
    after, message = initial_page(live_url, job, demo.owner)
    assert after.texts() == [str(i) for i in range(total - 1999, total + 1)]
    assert after.skips == [f"{total - 2000:,} lines not shown here · download the full log"]


async def fill(group: str, count: int) -> None:
    layer = get_channel_layer()
    for _ in range(count):
        await layer.group_send(group, {"type": "log.flush"})


def test_a_page_whose_channel_was_full_still_gets_every_line_and_is_still_rechecked(
    demo, live_url, daphne_server, docker_client
):
    """A page that falls far behind a burst (here: its server stopped while its channel filled) is
    refused the pushes a full channel cannot take, the job's last ones included. No later push will
    come to tell it, so it reads the persisted log itself on its own timer; and its access is still
    checked (its timers are not channel messages a full channel drops)."""
    total = 3000
    go = "/tmp/go"  # the job prints once the test made this file: after the channel is full
    job = submit_job(
        demo, name="behind", image=BUSYBOX, command=f"while [ ! -e {go} ]; do sleep 0.1; done; seq 1 {total}"
    )
    running_instance(job)
    group = realtime.log_group(job.id, 0)
    capacity = settings.CHANNEL_LAYERS["default"]["CONFIG"]["capacity"]
    live = PageLog()
    with socket(live_url, job, demo.owner) as ws:
        live.apply(ws.recv(timeout=20))
        os.kill(daphne_server.proc.pid, signal.SIGSTOP)
        try:
            # The fault: the page's channel full. Messages the page takes as no-ops (a flush with
            # nothing new) fill it before the job prints; then every push of the job is refused.
            async_to_sync(fill)(group, capacity)
            assert job_container(docker_client, job.id).exec_run(["touch", go], user="1000:1000").exit_code == 0
            wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=60, message="the job to end")
        finally:
            os.kill(daphne_server.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 3 * settings.WS_ACCESS_RECHECK_S + 10
        while not live.lines or live.texts()[-1] != str(total):
            assert time.monotonic() < deadline, f"the page stayed at {live.texts()[-1:]}"
            try:
                live.apply(ws.recv(timeout=1))
            except TimeoutError:
                pass
        not_shown = sum(
            int(re.match(r"([\d,]+) lines? not shown", skip).group(1).replace(",", "")) for skip in live.skips
        )
        assert not_shown + live.received_lines == total, (not_shown, live.received_lines)
        type(demo.owner).objects.filter(pk=demo.owner.pk).update(is_active=False)
        assert closed_within(ws, 3 * settings.WS_ACCESS_RECHECK_S + 5) == CLOSE_FORBIDDEN


@pytest.mark.browser
def test_the_log_view_draws_a_progress_bar_as_one_line(demo, new_page):
    job = python_job(demo, "bars-browser", BAR_SCRIPT.replace("time.sleep(2)", "time.sleep(4)"))
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.goto(f"/jobs/{job.id}/?tab=logs")
    lines = page.locator("#log-lines .ln")
    expect(lines.filter(has_text="RuntimeError: boom")).to_have_count(1, timeout=60_000)
    expect(lines).to_have_count(len(BAR_LINES))
    assert [text.strip() for text in lines.all_inner_texts()] == BAR_LINES
    expect(page.locator("#log-lines .ln .f1.bo")).to_have_text("RuntimeError: boom")
    shot(page, "hostile-output-progress-bar")
    wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=60, message="the job to end")
    page.reload()
    expect(lines.filter(has_text="RuntimeError: boom")).to_have_count(1)
    assert [text.strip() for text in lines.all_inner_texts()] == BAR_LINES


@pytest.mark.browser
def test_the_log_view_shows_binary_as_text_and_cuts_a_long_line(demo, new_page):
    script = (
        "import sys; out = sys.stdout.buffer\n"
        "out.write(b'nul \\x00 bad \\xff\\xfe \\x1b[33myellow\\x1b[0m <i>not markup</i> \\x1b]0;title\\x07done\\n')\n"
        "out.write(b'0123456789' * 30000)\n"
    )
    job = python_job(demo, "binary-browser", script)
    wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=60, message="the job to end")
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.goto(f"/jobs/{job.id}/?tab=logs")
    lines = page.locator("#log-lines .ln")
    expect(lines).to_have_count(2)
    expect(lines.first).to_have_text("nul ^@ bad \ufffd\ufffd yellow <i>not markup</i> done")
    expect(lines.first.locator(".f3")).to_have_text("yellow")
    expect(lines.nth(1).locator(".more")).to_have_text(" … 298,000 more characters (full log)")
    shot(page, "hostile-output-binary-and-long-line")
