"""The log pages' terminal emulator (jobs/runtime/terminal.py), fed records as the follower
persists them: what a terminal would show, as lines identified by the record that started them."""

from __future__ import annotations

import random

from jobs.runtime.logrecords import CHUNK_BYTES
from jobs.runtime.terminal import Terminal


class Feeder:
    """Feeds records numbered from 1, each with a timestamp of its own unless given one."""

    def __init__(self, **options):
        self.term = Terminal(**options)
        self.number = 0

    def __call__(self, payload: bytes, more: bool = False, ts: int | None = None) -> Feeder:
        self.number += 1
        self.term.feed(self.number, ts if ts is not None else self.number * 1000, payload, more)
        return self

    def screen(self) -> list[tuple[int, str]]:
        return self.term.screen()

    def texts(self) -> list[str]:
        return [text for _, text in self.term.screen()]


def html_of(term: Terminal) -> list[tuple[int, str]]:
    return [(line.id, line.html(term.cap)) for line in term.take().new]


def test_plain_lines_are_numbered_by_the_record_that_started_them():
    feed = Feeder()
    for i in range(1, 4):
        feed(f"line {i}".encode())
    assert feed.screen() == [(1, "line 1"), (2, "line 2"), (3, "line 3")]


def test_a_progress_bar_redrawn_with_carriage_returns_is_one_line_in_its_last_state():
    feed = Feeder()
    feed(b"epoch 1")
    # Docker buffers \r updates until 16 KB or a newline: they arrive in one frame, or chunks.
    bar = b"".join(b"\r%3d%%|%-10s|" % (p % 101, b"#" * (p % 101 // 10)) for p in range(0, 1111))
    assert len(bar) > CHUNK_BYTES
    feed(bar[:CHUNK_BYTES], more=True, ts=7)
    assert feed.term.take().new[-1].id == 2  # the bar's line, sent with its first state
    feed(bar[CHUNK_BYTES:], ts=7)
    feed(b"done")
    changes = feed.term.take()
    assert [line.id for line in changes.new] == [4]  # records 2 and 3 were the bar's chunks
    assert feed.screen() == [(1, "epoch 1"), (2, "100%|##########|"), (4, "done")]
    assert [line.id for line in changes.changed] == [2]  # replaced in place, not appended


def test_nested_bars_move_up_with_esc_a_and_rewrite_the_earlier_line():
    """tqdm's nested bars: the inner bar is drawn one line down (\\n), then ESC[A goes back up."""
    feed = Feeder()
    feed(b"\router   0%")
    feed(b"\rinner   0%\x1b[A")
    for p in (50, 100):
        feed(b"\rinner %3d%%\x1b[A\router %3d%%" % (p, p // 2))  # ends on the outer line: \n goes down to the inner
    assert feed.texts() == ["outer  50%", "inner 100%"]
    feed(b"")  # the line feed from the outer line moves down to the inner one, adds nothing
    feed(b"after")
    assert feed.texts() == ["outer  50%", "inner 100%", "after"]


def test_cursor_and_erase_sequences():
    feed = Feeder()
    feed(b"abcdef\x1b[3D\x1b[K")
    feed(b"abcdef\r\x1b[2C\x1b[1K")
    feed(b"abcdef\x1b[2K")
    feed(b"ab\bX\tT")
    feed(b"0123456789\x1b[4GZ\x1b[2CY")
    feed(b"x\x1b[5Cy")
    assert feed.texts() == ["abc", "   def", "", "aX      T", "012Z45Y789", "x     y"]


def test_cursor_up_stops_at_the_oldest_editable_line():
    feed = Feeder(keep=3)
    for i in range(5):
        feed(f"l{i}".encode())
    feed(b"\x1b[99A\rTOP")  # the record starts a line (6), then goes up as far as it can
    assert feed.texts() == ["TOP", "l4", ""]
    assert [line.text for line in feed.term.take().new] == ["l0", "l1", "l2", "TOP", "l4", ""]


def test_colours_become_classes_and_text_is_escaped():
    feed = Feeder()
    feed(b"\x1b[1;31mError\x1b[0m <script>alert(1)</script> \x1b[38;5;10mok\x1b[38;2;1;2;3m24bit\x1b[m plain")
    [(number, html)] = html_of(feed.term)
    assert number == 1
    assert html.startswith('<span class="f1 bo">Error</span> &lt;script&gt;alert(1)&lt;/script&gt; ')
    assert '<span class="f10">ok24bit</span> plain' in html
    assert "<script>" not in html


def test_other_escapes_are_dropped_and_controls_shown():
    feed = Feeder()
    feed(b"\x1b]0;window title\x07a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b\x1b(B\x1b7c\x1b[?25ld")
    feed(b"nul\x00bel\x07del\x7fc1\xc2\x9bend")
    assert feed.texts() == ["alinkbcd", "nul^@beldel^?c1\ufffdend"]
    html = html_of(feed.term)[1][1]
    assert '<span class="ctl">^@</span>' in html


def test_an_unterminated_osc_swallows_at_most_its_line():
    feed = Feeder()
    feed(b"before\x1b]0;never ends")
    feed(b"next line")
    assert feed.texts() == ["before", "next line"]


def test_an_escape_sequence_cut_between_chunks_is_still_one_sequence():
    term = Terminal(cap=CHUNK_BYTES + 10)
    term.feed(1, 9, b"a" * (CHUNK_BYTES - 3) + b"\x1b[3", True)
    term.feed(2, 9, b"1mred", False)
    [line] = term.take().new
    assert line.text == "a" * (CHUNK_BYTES - 3) + "red"
    assert line.html(term.cap).endswith('<span class="f1">red</span>')


def test_a_multibyte_character_split_between_chunks_decodes_once():
    term = Terminal(cap=CHUNK_BYTES + 10)
    euro = "€".encode()
    term.feed(1, 5, b"x" * (CHUNK_BYTES - 2) + euro[:2], True)
    term.feed(2, 5, euro[2:] + b"!", False)
    assert term.screen() == [(1, "x" * (CHUNK_BYTES - 2) + "€!")]


def test_invalid_utf8_and_a_character_cut_by_the_end_of_a_line_become_replacement_characters():
    feed = Feeder()
    feed(b"bad \xff\xfe end")
    feed("cut €".encode()[:-1])
    feed(b"next")
    assert feed.texts() == ["bad \ufffd\ufffd end", "cut \ufffd", "next"]


def test_records_join_only_as_docker_splits_lines():
    feed = Feeder()
    feed(b"a" * CHUNK_BYTES, more=True, ts=1)
    feed(b"b" * 10, more=True, ts=1)  # the last chunk of the long line (no newline: local driver)
    feed(b"short, no newline", more=True, ts=2)  # ended a line: something follows
    feed(b"c" * CHUNK_BYTES, more=True, ts=3)
    feed(b"stderr line", ts=4)  # another stream's line between two chunks: a new line
    assert [(n, len(t)) for n, t in feed.screen()] == [(1, 2000), (3, 17), (4, 2000), (5, 11)]
    assert feed.term.window[0].width == CHUNK_BYTES + 10


def test_long_lines_are_capped_and_say_how_much_more_there_is():
    term = Terminal(cap=100)
    for i in range(3):
        term.feed(i + 1, 7, b"y" * CHUNK_BYTES, True)
    [line] = term.take().new
    assert line.text == "y" * 100
    assert line.hidden(100) == 3 * CHUNK_BYTES - 100
    assert f"{3 * CHUNK_BYTES - 100:,} more characters" in line.html(100)


def test_take_keeps_at_most_max_new_lines_and_counts_the_rest():
    feed = Feeder(max_new=10)
    for i in range(25):
        feed(f"{i}".encode())
    changes = feed.term.take()
    assert [line.text for line in changes.new] == [str(i) for i in range(15, 25)]
    assert changes.dropped == 15
    assert feed.term.take().new == []


def test_a_huge_csi_parameter_is_harmless():
    feed = Feeder()
    feed(b"a\x1b[" + b"9" * 5000 + b"Cb\x1b[999999999Cc\x1b[999999999Ad")
    assert feed.screen()[0][1].startswith("a")


def test_random_bytes_never_raise_and_render_the_same_twice():
    rng = random.Random(1234)
    alphabet = [b"\r", b"\n", b"\x1b", b"[", b"]", b"A", b"K", b"m", b"\x07", b"\x00", b"\xff", b"\xe2\x82", b"7", b";"]
    for trial in range(200):
        records = []
        for n in range(rng.randint(1, 40)):
            parts = [rng.choice(alphabet) if rng.random() < 0.5 else bytes([rng.randrange(256)]) for _ in range(30)]
            payload = b"".join(parts).replace(b"\n", b"")
            records.append((n + 1, rng.choice([1, 2, 2, 3]), payload, rng.random() < 0.3))
        renders = []
        cap, keep = rng.choice([5, 50, 2000]), rng.choice([1, 3, 200])
        for _ in range(2):
            term = Terminal(cap=cap, keep=keep)
            for number, ts, payload, more in records:
                term.feed(number, ts, payload, more)
            renders.append([(line.id, line.html(term.cap)) for line in term.take().new])
        assert renders[0] == renders[1], trial
