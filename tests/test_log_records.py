"""The persisted log's records and its bounded readers (jobs/runtime/logrecords.py, logs.py,
logview.py): every byte kept, old files still read, nothing a job prints makes a reader raise."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs.runtime import logrecords as lr
from jobs.runtime.logrecords import CHUNK_BYTES, encode_record, iter_raw, iter_records, read_tail
from jobs.runtime.logs import log_path, parse_frame, read_lines, recent_text, split_frame, tail_lines
from jobs.runtime.logview import load_window, tail_texts
from jobs.runtime.terminal import Terminal

T0 = 1_780_000_000_000_000_000


def write(path: Path, records: list[tuple[int, bool, bytes]]) -> int:
    data = b"".join(encode_record(ts, more, payload) for ts, more, payload in records)
    path.write_bytes(data)
    return len(data)


def fake_run(tmp_path, records: list[tuple[int, bool, bytes]] | None = None, raw: bytes | None = None):
    """A task run as the readers see it: its log file and the acknowledged length."""
    run = SimpleNamespace(attempt=SimpleNamespace(job_id=f"t-{tmp_path.name}", number=1), index=0)
    path = log_path(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = raw if raw is not None else b"".join(encode_record(*r) for r in records)
    path.write_bytes(data)
    run.log_bytes, run.log_lines = len(data), data.count(b"\n")
    return run


# -- the format --------------------------------------------------------------------------------------
def test_a_record_keeps_every_byte_of_a_frame():
    payload = b"\r 50%|##  |\x1b[A\x00\xff\xfe\x1b]0;t\x07 \xe2\x82"
    frame = b"2026-11-30T17:32:20.690144749Z " + payload
    assert parse_frame(frame + b"\n") == (1_796_059_940_690_144_749, False, payload)
    assert parse_frame(frame) == (1_796_059_940_690_144_749, True, payload)
    assert split_frame(frame + b"\n") == (1_796_059_940_690_144_749, payload.decode("utf-8", "replace"))
    record = encode_record(5, True, payload)
    assert record == b"5+" + payload + b"\n"
    assert lr.parse_record(record[:-1]) == (5, True, payload)


def test_frames_that_are_not_docker_frames_never_raise():
    assert parse_frame(b"garbage") == (0, True, b"")
    assert parse_frame(b"not-a-time payload\n") == (0, False, b"payload")
    assert parse_frame(b"") == (0, True, b"")
    ts, more, payload = parse_frame(b"2026-11-30T17:32:20Z a\nb\n")  # never from Docker: still one record
    assert (more, payload.count(b"\n")) == (False, 0)
    assert lr.parse_record(b"no header here") == (0, False, b"no header here")


def test_old_files_read_as_lines(tmp_path):
    path = tmp_path / "old.log"
    path.write_bytes(b"100 first line\n200 +plus is text\n300 \n")
    records = list(iter_records(path, 0, path.stat().st_size))
    assert [(r.number, r.ts_ns, r.more, r.payload) for r in records] == [
        (1, 100, False, b"first line"),
        (2, 200, False, b"+plus is text"),
        (3, 300, False, b""),
    ]
    assert b"".join(iter_raw(path, 0, path.stat().st_size, path.stat().st_size)) == b"first line\n+plus is text\n\n"


# -- readers -------------------------------------------------------------------------------------------
def test_forward_reads_cross_blocks_with_exact_offsets(tmp_path):
    path = tmp_path / "a.log"
    records = [(T0 + i, i % 7 == 0, bytes([i % 256]) * (i % 3000)) for i in range(4000)]
    size = write(path, records)
    assert size > 2 * lr.READ_BLOCK
    read = list(iter_records(path, 0, size))
    assert [(r.ts_ns, r.more, r.payload) for r in read] == [
        (t, m, p.replace(b"\n", lr.NEWLINE_SIGN)) for t, m, p in records
    ]
    data = path.read_bytes()
    assert all(data[r.offset : r.end] == encode_record(r.ts_ns, r.more, r.payload) for r in read)
    assert [r.number for r in read] == list(range(1, 4001))
    middle = read[1234]
    assert next(iter_records(path, middle.offset, size, 1235)) == middle


def test_the_tail_is_bounded_by_records_and_bytes(tmp_path):
    path = tmp_path / "a.log"
    size = write(path, [(T0 + i, False, b"x" * 1000) for i in range(5000)])
    tail = read_tail(path, size, 5000, 100, 10**9)
    assert [r.number for r in tail.records] == list(range(4901, 5001))
    assert tail.before.number == 4900 and tail.before.end == tail.records[0].offset
    by_bytes = read_tail(path, size, 5000, 10**6, 50_000)
    assert 40 <= len(by_bytes.records) <= 50 and by_bytes.records[-1].number == 5000
    whole = read_tail(path, size, 5000, 10**6, 10**9)
    assert len(whole.records) == 5000 and whole.before is None
    assert read_tail(tmp_path / "missing.log", 10, 1, 5, 5).records == []


def test_a_time_is_found_by_bisection(tmp_path):
    path = tmp_path / "a.log"
    size = write(path, [(T0 + i // 3, False, b"line %d" % i) for i in range(30_000)])
    offset = lr.offset_of_time(path, T0 + 5000, size)
    first = next(iter_records(path, offset, size))
    assert (first.ts_ns, first.payload) == (T0 + 5000, b"line 15000")
    assert lr.offset_of_time(path, T0 - 1, size) == 0
    assert lr.offset_of_time(path, T0 + 10**9, size) == size


def test_the_raw_log_is_exactly_what_the_job_printed(tmp_path):
    """As Docker's local driver frames it: a long line in 16 KB chunks of one timestamp whose
    last chunk has no newline, short unterminated output with a timestamp of its own."""
    long_line = bytes(range(256)).replace(b"\n", b"") * 200  # 50,800 bytes
    chunks = [long_line[i : i + CHUNK_BYTES] for i in range(0, len(long_line), CHUNK_BYTES)]
    records = [(T0, False, b"\r\x1b[31mcolour\x00")]
    records += [(T0 + 1, True, chunk) for chunk in chunks]
    records += [(T0 + 2, True, b"a" * CHUNK_BYTES), (T0 + 2, True, b"")]  # a 16 KB line and its newline
    records += [(T0 + 3, False, b"plain"), (T0 + 4, True, b"no newline at the end")]
    path = tmp_path / "a.log"
    size = write(path, records)
    printed = b"\r\x1b[31mcolour\x00\n" + long_line + b"\n" + b"a" * CHUNK_BYTES + b"\nplain\nno newline at the end"
    assert b"".join(iter_raw(path, 0, size, size)) == printed
    start = lr.offset_of_time(path, T0 + 1, size)
    end = lr.offset_of_time(path, T0 + 2, size)
    assert b"".join(iter_raw(path, start, end, size)) == long_line + b"\n"  # something follows it


def test_a_window_inside_a_long_line_starts_where_a_terminal_would(tmp_path):
    path = tmp_path / "a.log"
    huge = [(T0 + 1, True, bytes([65 + i % 26]) * CHUNK_BYTES) for i in range(300)]
    size = write(path, [(T0, False, b"before")] + huge)
    term = Terminal(cap=100)
    window = load_window(term, path, 301, size, 50, 10**9)
    [line] = term.take().new
    assert line.id == window.first.number == 252
    assert window.line_start == 2  # the line's first chunk: the record after "before"
    assert line.text == "A" * 100  # the line's own head, found by time
    assert line.width == 300 * CHUNK_BYTES - CHUNK_BYTES + CHUNK_BYTES  # every character counted

    bar = b"".join(b"\r%3d%%|%-20s|" % (p % 100, b"#" * (p % 100 // 5)) for p in range(20_000))
    chunks = [bar[i : i + CHUNK_BYTES] for i in range(0, len(bar), CHUNK_BYTES)]
    size = write(path, [(T0, False, b"before")] + [(T0 + 1, True, c) for c in chunks])
    term = Terminal()
    load_window(term, path, 1 + len(chunks), size, 5, 10**9)
    last = bar.rsplit(b"\r", 1)[1].decode()
    assert [line.text for line in term.take().new] == [last]  # the bar's last state, one line


def test_readers_of_a_run_never_raise_on_carriage_returns(tmp_path):
    """The bug: splitlines() split records at \\r, and int() of the piece raised, so a failed job
    with a progress bar was never decided."""
    records = [(T0 + i, False, b"step %d\r 10%%|#|\r 20%%|##|\x1b[A\x0b\x0c\x1c\x1d\x1e\x85" % i) for i in range(100)]
    records.append((T0 + 100, False, b"Traceback (most recent call last):"))
    run = fake_run(tmp_path, records)
    assert len(read_lines(run)) == 101 and read_lines(run)[0].text.startswith("step 0\r")
    assert [r.number for r in read_lines(run, after=95)] == [96, 97, 98, 99, 100, 101]
    assert [r.number for r in read_lines(run, after=10, limit=3)] == [11, 12, 13]
    assert [r.number for r in tail_lines(run, 3)] == [99, 100, 101]
    recent = recent_text(run, 5)
    assert recent[-1] == "Traceback (most recent call last):" and len(recent) <= 5


def test_recent_text_is_bounded_for_a_huge_last_line(tmp_path):
    records = [(T0, False, b"[progress] step=7")] + [(T0 + 1, True, b"z" * CHUNK_BYTES) for _ in range(400)]
    run = fake_run(tmp_path, records)
    texts = tail_texts(run, 50)
    assert texts[-1] == "z" * 4096


# -- fuzz ---------------------------------------------------------------------------------------------------
def reference_raw(records: list[tuple[int, bool, bytes]]) -> bytes:
    out = b""
    for i, (_, more, payload) in enumerate(records):
        out += payload
        followed = i + 1 < len(records)
        if not more or (followed and len(payload) < CHUNK_BYTES):
            out += b"\n"
    return out


@pytest.mark.parametrize("seed", range(12))
def test_random_records_and_random_files_never_make_a_reader_raise(tmp_path, seed):
    rng = random.Random(seed)
    pieces = [b"\r", b"\x1b[", b"\x1b]", b"\x00", b"\xff", b"\xe2\x82", b"+", b" ", b"123", b"\x07", b"A", b"m"]
    records = []
    ts = T0
    for _ in range(rng.randint(1, 300)):
        ts += rng.choice([0, 0, 1, 1000])
        if rng.random() < 0.05:
            payload = bytes(rng.randrange(256) for _ in range(CHUNK_BYTES)).replace(b"\n", b"x")
        else:
            payload = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        records.append((ts, rng.random() < 0.3, payload))
    path = tmp_path / "a.log"
    size = write(path, records)
    read = list(iter_records(path, 0, size))
    assert [(r.ts_ns, r.more, r.payload) for r in read] == records
    assert b"".join(iter_raw(path, 0, size, size)) == reference_raw(records)
    for _ in range(10):
        n, b = rng.randint(1, 400), rng.randint(1, 100_000)
        tail = read_tail(path, size, len(records), n, b)
        assert [(r.number, r.payload) for r in tail.records] == [
            (r.number, r.payload) for r in read[-len(tail.records) :]
        ]
        lr.offset_of_time(path, rng.randint(T0 - 5, ts + 5), size)
        term = Terminal(cap=rng.choice([10, 2000]), keep=rng.choice([2, 200]))
        load_window(term, path, len(records), size, n, b)
        for line in term.take().new:
            line.html(term.cap)
    run = fake_run(tmp_path, records)
    read_lines(run)
    tail_lines(run, 10)
    recent_text(run)

    # A file that is not records at all (a bug, a disk error): readers read, never raise.
    garbage = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200_000)))
    run = fake_run(tmp_path, raw=garbage)
    run.log_lines = max(run.log_lines, 1)
    read_lines(run)
    tail_lines(run, 50)
    recent_text(run)
    b"".join(iter_raw(log_path(run), 0, run.log_bytes, run.log_bytes))
    lr.offset_of_time(log_path(run), T0, run.log_bytes)


# -- what a page is sent (jobs/logstream.py) ----------------------------------------------------------
def page_view(tmp_path, records):
    from jobs.logstream import RunView

    run = fake_run(tmp_path, records)
    run.id, run.container_name = 7, "c"
    run.attempt.number, run.host = 1, SimpleNamespace(name="h")
    return run, RunView(run, "/download/")


def test_a_page_that_skips_inside_a_long_line_keeps_it_one_line(tmp_path):
    from jobs import logstream

    chunks = [(T0 + 1, True, b"q" * CHUNK_BYTES) for _ in range(600)]
    run, view = page_view(tmp_path, [(T0, False, b"first")] + chunks)
    read = list(iter_records(log_path(run), 0, run.log_bytes))
    view.catch_up(read[:11], 11, read[10].end)
    appended, replaced, count = view.fragments()
    assert count == 2 and 'data-n="2"' in appended and replaced == ""
    view.catch_up([], run.log_lines, run.log_bytes)  # 9.5 MB further: more than the tail's bytes
    appended, replaced, count = view.fragments()
    # Nothing appended: the long line was redrawn in place (counted, so redraws are paced too).
    assert "not shown" not in appended and 'class="ln"' not in appended and count == replaced.count("hx-swap-oob")
    assert replaced.startswith(f'<div hx-swap-oob="innerHTML:{logstream.line_selector(7, 2)}">qqq')
    assert f"{600 * CHUNK_BYTES - 2000:,} more characters" in replaced


def test_a_page_far_behind_says_how_many_lines_it_did_not_show(tmp_path):
    run, view = page_view(tmp_path, [(T0 + i, False, b"%d" % i) for i in range(1, 5001)])
    read = list(iter_records(log_path(run), 0, run.log_bytes))
    view.catch_up(read[:10], 10, read[9].end)
    assert view.fragments()[2] == 10
    view.catch_up(read[10:20], 20, read[19].end)  # follows on: the pushed records
    view.catch_up(read[4000:4010], 4010, read[4009].end)  # a gap of 3,980 records: skips
    appended, _, count = view.fragments()
    assert "2,000 lines not shown here" in appended  # 11..2010, never sent; the tail is 2011..4010
    assert count == 2000 and appended.count('class="ln"') == count and 'data-n="2011"' in appended
    view.catch_up(read[4010:4100], 4100, read[4099].end)
    view.catch_up([], 4200, read[4199].end)  # not pushed: from the file
    appended, _, count = view.fragments()
    assert count == 190 and 'data-n="4101"' in appended and 'data-n="4200"' in appended
