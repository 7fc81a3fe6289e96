"""The persisted log of a task run: one record per Docker log frame, and bounded readers of it.

A record is `<ts_ns><flag><payload>\\n`: the frame's timestamp in ns, a flag, and the frame's
payload exactly as the job printed it (any bytes but `\\n`: Docker splits lines on it). The flag
is ' ' when the frame ended with a newline, '+' when it did not: a chunk of a line longer than
Docker's 16 KB buffer (all chunks of one line carry the line's timestamp), the last chunk of
such a line (the `local` log driver drops its newline), or output that ended without one.
Files written before the flag existed (`<ts> <text>\\n`) read as records that all end lines.

Records split on b"\\n" only. Every reader here is bounded: it seeks, reads blocks, and stops at
a number of records or bytes; none raises on what a job printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 16384  # Docker's log buffer: a longer line arrives in chunks of exactly this size
READ_BLOCK = 1024 * 1024  # forward reads
BACK_BLOCK = 64 * 1024  # backward reads (tails)
PROBE_BYTES = 2 * (CHUNK_BYTES + 64)  # a window that always holds the start of a record
MAX_RECORD_BYTES = 4 * 1024 * 1024  # a "record" longer than this was not written by the follower: cut it
NEWLINE_SIGN = "\u2424".encode()  # stands for a newline inside a frame (never sent by Docker)

_RECORD = re.compile(rb"(\d{1,20})([ +])")
_PLUS_RECORD = re.compile(rb"(?m)^\d{1,20}\+")
_PLAIN_HEADER = re.compile(rb"(?m)^\d{1,20} ")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One record: `number` is 1-based within the task run (0 where a reader cannot know it)."""

    number: int
    ts_ns: int
    payload: bytes = b""
    more: bool = False  # the frame did not end with a newline
    offset: int = 0  # where the record starts in the file
    size: int = 0  # its length in the file, header and newline included

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8", errors="replace")

    @property
    def end(self) -> int:
        return self.offset + self.size


# -- the format ---------------------------------------------------------------------------------
def encode_record(ts_ns: int, more: bool, payload: bytes) -> bytes:
    if b"\n" in payload:  # never from Docker; kept visible rather than breaking the file's records
        payload = payload.replace(b"\n", NEWLINE_SIGN)
    return b"%d%s%s\n" % (ts_ns, b"+" if more else b" ", payload)


def parse_record(raw: bytes) -> tuple[int, bool, bytes]:
    """A record without its newline -> (ts_ns, more, payload); never raises (a line that is not a
    record, which the follower never writes, reads as a whole line of text at time 0)."""
    match = _RECORD.match(raw)
    if match is None:
        return 0, False, raw
    return int(match.group(1)), match.group(2) == b"+", raw[match.end() :]


def joins(prev: LogLine | tuple[int, bool, int] | None, ts_ns: int) -> bool:
    """Whether a record at ts_ns continues the line of `prev` (a record, or (ts, more, payload
    size)): prev was a full 16 KB chunk without newline and carries the same timestamp. Anything
    else starts a new line: even a short record without newline ended one when more follows
    (the last chunk of a long line, or output the job ended without a newline)."""
    if prev is None:
        return False
    ts, more, size = (prev.ts_ns, prev.more, len(prev.payload)) if isinstance(prev, LogLine) else prev
    return more and size >= CHUNK_BYTES and ts == ts_ns


def newline_after(record: LogLine, followed: bool) -> bool:
    """Whether the job printed a newline after this record's payload (for the raw log): after a
    frame that ended with one, and after a short chunk without one when anything follows it (a
    short chunk is the end of a line or of the output; only at the very end can it be either:
    Docker's local driver gives the same frames for `abc` and `abc\\n` there)."""
    return not record.more or (followed and len(record.payload) < CHUNK_BYTES)


# -- forward ------------------------------------------------------------------------------------
def iter_records(path: Path, start: int = 0, end: int = 0, first_number: int = 1) -> Iterator[LogLine]:
    """The records in [start, end) (start is a record's start, end the acknowledged length),
    read in blocks: memory stays at one block whatever the file's size."""
    if end <= start:
        return
    try:
        f = open(path, "rb")
    except FileNotFoundError:  # deleted by retention, or never written
        return
    with f:
        f.seek(start)
        position, number = start, first_number
        pending, pending_at = b"", start
        while position < end:
            block = f.read(min(READ_BLOCK, end - position))
            if not block:
                break
            position += len(block)
            data = pending + block if pending else block
            cut = 0
            while (newline := data.find(b"\n", cut)) >= 0:
                ts, more, payload = parse_record(data[cut:newline])
                yield LogLine(number, ts, payload, more, pending_at + cut, newline + 1 - cut)
                number += 1
                cut = newline + 1
            pending, pending_at = data[cut:], pending_at + cut
            if len(pending) > MAX_RECORD_BYTES:
                ts, more, payload = parse_record(pending)
                yield LogLine(number, ts, payload, True, pending_at, len(pending))
                number += 1
                pending, pending_at = b"", pending_at + len(pending)


def record_at(path: Path, offset: int, end: int) -> LogLine | None:
    """The record that starts at `offset` (number unknown: 0)."""
    return next(iter_records(path, offset, min(end, offset + CHUNK_BYTES + 64), 0), None)


# -- backward -----------------------------------------------------------------------------------
@dataclass
class Tail:
    records: list[LogLine]  # oldest first
    before: LogLine | None  # the record just before them, where it was read (None at the start)


def read_tail(path: Path, end: int, end_number: int, max_records: int, max_bytes: int) -> Tail:
    """At most max_records records (and about max_bytes of them, at least one) that end at
    `end`, the record numbered end_number last; reads backwards in blocks, never more than
    max_bytes plus a record or two."""
    if end <= 0 or max_records <= 0:
        return Tail([], None)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return Tail([], None)
    blocks: list[bytes] = []
    newlines = 0
    start = end
    with f:
        while start > 0:
            complete = newlines - 1  # the piece before the first newline may be partial
            if complete >= max_records + 1 or (end - start > max_bytes + PROBE_BYTES and complete >= 1):
                break
            size = min(BACK_BLOCK, start)
            start -= size
            f.seek(start)
            block = f.read(size)
            blocks.append(block)
            newlines += block.count(b"\n")
    data = b"".join(reversed(blocks))
    cut = 0 if start == 0 else data.find(b"\n") + 1
    pieces = data[cut:].split(b"\n")[:-1]  # `end` is a record boundary: the last piece is empty
    offsets = []
    position = start + cut
    for piece in pieces:
        offsets.append(position)
        position += len(piece) + 1
    kept: list[LogLine] = []
    total = 0
    before: LogLine | None = None
    for i in range(len(pieces) - 1, -1, -1):
        size = len(pieces[i]) + 1
        number = end_number - (len(pieces) - 1 - i)
        ts, more, payload = parse_record(pieces[i])
        record = LogLine(number, ts, payload, more, offsets[i], size)
        if len(kept) >= max_records or (kept and total + size > max_bytes):
            before = record
            break
        kept.append(record)
        total += size
    kept.reverse()
    return Tail(kept, before)


# -- by time ------------------------------------------------------------------------------------
def _first_start_at_or_after(f, position: int, end: int) -> int:
    """The offset of the first record that starts at or after `position` (end when none)."""
    if position <= 0:
        return 0
    f.seek(position - 1)
    window = f.read(min(PROBE_BYTES, end - position + 1))
    newline = window.find(b"\n")
    return end if newline < 0 else position + newline


def _ts_at(f, offset: int) -> int:
    f.seek(offset)
    return parse_record(f.read(24))[0]


def offset_of_time(path: Path, ts_ns: int, end: int, lo: int = 0, hi: int | None = None) -> int:
    """The offset of the first record in [lo, hi) with a timestamp at or after ts_ns (hi when
    none): a binary search over the file (records are in time order, but for the chunks of a
    line that another stream's lines interleave), then a scan of at most a few blocks."""
    hi = end if hi is None else hi
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return hi
    with f:
        while hi - lo > 4 * PROBE_BYTES:
            start = _first_start_at_or_after(f, (lo + hi) // 2, hi)
            if start >= hi:
                break
            if _ts_at(f, start) >= ts_ns:
                hi = start
            else:
                lo = start
    for record in iter_records(path, lo, hi, 0):
        if record.ts_ns >= ts_ns:
            return record.offset
    return hi


def line_head(path: Path, record: LogLine) -> LogLine | None:
    """The first chunk of the long line `record` continues (its chunks share a timestamp), found
    by time, not by reading the line: None when it is not found that way."""
    offset = offset_of_time(path, record.ts_ns, record.offset, 0, record.offset)
    head = record_at(path, offset, record.offset) if offset < record.offset else None
    if head is None or head.ts_ns != record.ts_ns or not head.more or len(head.payload) < CHUNK_BYTES:
        return None
    return head


# -- the raw log --------------------------------------------------------------------------------
def iter_raw(path: Path, start: int, end: int, file_end: int) -> Iterator[bytes]:
    """Exactly the bytes the job printed between two record offsets: payloads and the newlines
    between them (newline_after), in blocks of about READ_BLOCK; file_end says whether anything
    follows `end`."""
    if end <= start:
        return
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    out = bytearray()
    pending = False  # a short chunk without newline: a newline follows it if anything does
    with f:
        f.seek(start)
        position, carry = start, b""
        while position < end:
            block = f.read(min(READ_BLOCK, end - position))
            if not block:
                break
            position += len(block)
            data = carry + block if carry else block
            last = data.rfind(b"\n") + 1
            if last == 0 and len(data) <= MAX_RECORD_BYTES and position < end:
                carry = data
                continue
            if last == 0 or position >= end:
                last = len(data)
            data, carry = data[:last], data[last:]
            if not pending and not _PLUS_RECORD.search(data):
                out += _PLAIN_HEADER.sub(b"", data)  # every record ends a line: only drop the headers
            else:
                for raw in data.split(b"\n")[: -1 if data.endswith(b"\n") else None]:
                    ts, more, payload = parse_record(raw)
                    if pending:
                        out += b"\n"
                    out += payload
                    if more:
                        pending = len(payload) < CHUNK_BYTES
                    else:
                        out += b"\n"
                        pending = False
            if len(out) >= READ_BLOCK:
                yield bytes(out)
                out.clear()
    if pending and end < file_end:
        out += b"\n"
    if out:
        yield bytes(out)
