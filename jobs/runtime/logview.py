"""Bounded views of a task run's log through the terminal emulator (terminal.py): the window a
log page starts with, and the text of the last lines that failure classification and the
work-lost estimate read. Each reads at most a number of records and of bytes from the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jobs.models import TaskRun

from .logrecords import CHUNK_BYTES, LogLine, joins, line_head, read_tail
from .logs import log_path
from .terminal import Terminal

RECENT_BYTES = 1024 * 1024  # recent_text's window: at most this many bytes,
RECENT_RECORDS_PER_LINE = 20  # and this many records per line asked for (cursor-up rewrites, chunks)
TEXT_CAP = 4096  # characters of a line kept for classification


@dataclass(frozen=True)
class Window:
    first: LogLine  # the window's first record: the id of the first line drawn
    line_start: int  # the number of the record that started that line (before the window, inside a long line)


def load_window(
    term: Terminal, path: Path, end_number: int, end_offset: int, max_records: int, max_bytes: int
) -> Window | None:
    """Feed `term` the last records before end_offset (at most max_records, about max_bytes);
    None when there are none.

    A window that starts inside a long line (a chunk continuing the one before it) starts that
    line where it makes sense: at its first carriage return in the window when it has one (a
    progress bar: its last states are here), else at the line's own first chunk, found by time
    without reading the line, with the middle counted as hidden characters; failing that, at
    the window's first record, marked as continued."""
    tail = read_tail(path, end_offset, end_number, max_records, max_bytes)
    if not tail.records:
        return None
    records = tail.records
    first = records[0]
    line_start = first.number
    if joins(tail.before, first.ts_ns):
        line = [first]
        for record in records[1:]:
            if not joins(line[-1], record.ts_ns):
                break
            line.append(record)
        head = line_head(path, first)
        header = len(str(first.ts_ns)) + 2
        if head is not None:  # every record between is a full chunk of the line
            line_start = first.number - (first.offset - head.offset) // (CHUNK_BYTES + header)
        redrawn = next(((i, r) for i, r in enumerate(line) if b"\r" in r.payload), None)
        if redrawn is not None:
            i, record = redrawn
            payload = record.payload[record.payload.index(b"\r") :]
            term.feed(first.number, record.ts_ns, payload, record.more, size=len(record.payload))
            records = records[i + 1 :]
        elif head is not None:
            term.feed(first.number, head.ts_ns, head.payload, head.more)
            gap = first.offset - head.end
            term.skip_columns(max(0, gap - gap // (CHUNK_BYTES + header) * header))
        else:
            term.feed(first.number, first.ts_ns, first.payload, first.more)
            term.mark_continued()
            records = records[1:]
    for record in records:
        term.feed(record.number, record.ts_ns, record.payload, record.more)
    return Window(first, line_start)


def tail_texts(task_run: TaskRun, count: int | None = 50, max_bytes: int = RECENT_BYTES) -> list[str]:
    """The text of the last `count` lines (all within max_bytes when None) as a terminal shows
    them: progress bars in their last state, without colours, at most TEXT_CAP characters each."""
    return [text for _, text in tail_lines(task_run, count, max_bytes)]


def tail_lines(task_run: TaskRun, count: int | None = 50, max_bytes: int = RECENT_BYTES) -> list[tuple[int, str]]:
    """tail_texts with each line's time: (Docker's timestamp of its first record in ns, text)."""
    if task_run.log_bytes <= 0:
        return []
    term = Terminal(cap=TEXT_CAP, max_new=count or 10**7)
    records = count * RECENT_RECORDS_PER_LINE + 200 if count is not None else 10**9
    load_window(term, log_path(task_run), task_run.log_lines, task_run.log_bytes, records, max_bytes)
    return [(line.ts_ns, line.text) for line in term.take().new]
