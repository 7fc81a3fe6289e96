"""What one log page was sent of one instance's log, and what to send it next (LogConsumer).

Each task run on the page has a RunView: a terminal (runtime/terminal.py) fed the run's records
in order, and how far it got (the last record number and where the next record starts in the
file). A page starts with the last TAIL_LINES records (TAIL_BYTES at most) of its runs, newest
first; then live records are fed as the follower pushes them, and the page is sent the lines
that were added (appended to #log-lines) and the lines that changed (each replaced in place,
by the record number that started it, within its run's separator: a progress bar redrawn 500
times stays one line). A page that falls more than the tail behind skips to the tail, with a
"N lines not shown" marker and a link to the full log: it never has more than the tail to send.
"""

from __future__ import annotations

from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from .models import TaskRun
from .runtime.logrecords import LogLine, iter_records, joins
from .runtime.logs import log_path
from .runtime.logview import Window, load_window
from .runtime.terminal import LINE_CAP, Line, Terminal

TAIL_LINES = 2000  # records a page starts with, and the most it is sent at once
TAIL_BYTES = 4 * 1024 * 1024  # bytes of records a page starts with, and the most read at once
BURST_LINES = 500  # lines sent within PACE_S (consumers.py) with more acknowledged: a burst


def separator_id(run_id: int) -> str:
    return f"lr-{run_id}"


def line_selector(run_id: int, line_id: int) -> str:
    """The line started by record `line_id` among the lines after the run's separator and
    before the next separator (each attempt numbers its records from 1)."""
    sep = separator_id(run_id)
    return f"#{sep}~[data-n='{line_id}']:not(#{sep}~.log-sep~*)"


class RunView:
    """One task run's log on one page."""

    def __init__(self, run: TaskRun, download_url: str):
        self.run, self.download_url = run, download_url
        self.path = log_path(run)
        self.term = Terminal(max_new=TAIL_LINES)
        self.have = 0  # the last record fed (or skipped)
        self.have_end = 0  # where the record after it starts in the file
        self.separator_sent = False
        self.not_shown = 0  # lines skipped since the last message
        self.window: Window | None = None  # the last window loaded from the file
        self.pending = (0, 0)  # (record number, end offset) acknowledged but not fed yet (a burst)
        self._carried: list[Line] = []  # changes of lines sent before a skip

    def load_tail(self, end_number: int, end_offset: int, max_records: int, max_bytes: int) -> tuple[int, int]:
        """A fresh terminal fed the window that ends at end_number/end_offset; returns the records
        and bytes it holds. Lines between what the page had and the window count as not shown."""
        self.term = Terminal(max_new=TAIL_LINES)
        window = None
        if max_records > 0 and max_bytes > 0:
            window = load_window(self.term, self.path, end_number, end_offset, max_records, max_bytes)
        line_start = window.line_start if window is not None else end_number + 1
        self.not_shown += max(0, line_start - 1 - self.have)
        self.have, self.have_end = end_number, end_offset
        self.window = window
        if window is None:
            return 0, 0
        return end_number - window.first.number + 1, end_offset - window.first.offset

    def skip_to(self, end_number: int, end_offset: int) -> None:
        """Too far behind to show everything: jump to the tail of what is acknowledged. A long
        line the page has open and the tail goes on with stays that line (replaced in place)."""
        pending = self.term.take()
        self.not_shown += len(pending.new) + pending.dropped
        carried = pending.changed  # lines the page has: their last state still goes out
        open_line, last = self.term.cursor_line, self.term.last_record
        not_shown = self.not_shown
        self.load_tail(end_number, end_offset, TAIL_LINES, TAIL_BYTES)
        window = self.window
        if window is not None and open_line is not None and open_line.sent and joins(last, window.first.ts_ns):
            self.not_shown = not_shown  # what was skipped were chunks of the open line
            self.term.adopt(open_line.id)
            carried = [line for line in carried if line is not open_line]
        self._carried += carried

    def feed(self, records) -> None:
        for record in records:
            if record.number > self.have:
                self.term.feed(record.number, record.ts_ns, record.payload, record.more)
                self.have, self.have_end = record.number, record.end

    def catch_up(self, records: list[LogLine], end_number: int, end_offset: int) -> None:
        """Feed the terminal up to record end_number (ending at end_offset): the pushed records
        where they follow on, the file for what was not pushed (a gap) or not fed (a burst);
        more than the tail behind, skip to the tail."""
        if end_number <= self.have:
            return
        if end_number - self.have > TAIL_LINES or end_offset - self.have_end > TAIL_BYTES:
            self.skip_to(end_number, end_offset)
            return
        if records and records[0].number <= self.have + 1:
            self.feed(records)
        if self.have < end_number:
            self.feed(iter_records(self.path, self.have_end, end_offset, self.have + 1))

    def fragments(self) -> tuple[str, str, int]:
        """(HTML to append to #log-lines, out-of-band replacements of lines already sent, the
        number of lines sent: appended or redrawn, so that a job that only redraws lines, say
        cursor-up and rewrite in a loop, is paced like one that prints new ones)."""
        changes = self.term.take()
        not_shown = self.not_shown + changes.dropped
        self.not_shown = 0
        separator = not self.separator_sent
        appended = ""
        if separator or not_shown or changes.new:
            self.separator_sent = True
            appended = render_to_string(
                "jobs/_log_lines.html",
                {
                    "run": self.run,
                    "separator": separator,
                    "separator_id": separator_id(self.run.id),
                    "not_shown": not_shown,
                    "not_shown_text": f"{not_shown:,}",
                    "download_url": self.download_url,
                    "lines": [(line.id, mark_safe(line.html(LINE_CAP))) for line in changes.new],
                },
            )
        changed = self._carried + changes.changed
        self._carried = []
        replaced = "".join(
            f'<div hx-swap-oob="innerHTML:{line_selector(self.run.id, line.id)}">{line.html(LINE_CAP)}</div>'
            for line in changed
        )
        return appended, replaced, len(changes.new) + len(changed)


def push_records(event: dict) -> list[LogLine] | None:
    """The records of a log.lines push (runtime/logs.py push_lines), with their file offsets;
    None for a push of another shape (a worker of an older version during an upgrade)."""
    records, offset = [], event.get("offset")
    try:
        for i, (ts_ns, more, payload) in enumerate(event["lines"]):
            size = len(str(ts_ns)) + len(payload) + 2
            records.append(LogLine(event["first"] + i, ts_ns, bytes(payload), bool(more), offset, size))
            offset += size
    except (KeyError, TypeError, ValueError):
        return None
    return records


def initial_views(runs: list[TaskRun], download_url: str) -> dict[int, RunView]:
    """A view of every run, the newest fed first within the page's tail budget."""
    views: dict[int, RunView] = {}
    records, size = TAIL_LINES, TAIL_BYTES
    for run in reversed(runs):
        view = RunView(run, download_url)
        used_records, used_bytes = view.load_tail(run.log_lines, run.log_bytes, records, size)
        records, size = records - used_records, size - used_bytes
        views[run.id] = view
    return {run.id: views[run.id] for run in runs}  # in attempt order
