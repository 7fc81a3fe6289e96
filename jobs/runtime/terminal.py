"""What a terminal would show of a job's output: a small, pure terminal emulator for log pages.

Fed log records in order (`feed`: a frame's payload and whether it ended with a newline), it
keeps the last KEEP_LINES lines editable, as a terminal's screen: `\\r` returns to the start of
the line (a progress bar redraws one line), `ESC[nA`/`ESC[nB` move the cursor up and down
(nested progress bars rewrite an earlier line), `\\b`, `\\t`, column moves (`ESC[nC`, `ESC[nD`,
`ESC[nG`), erase in line (`ESC[K`, `ESC[1K`, `ESC[2K`), and SGR colours (the 16 basic colours,
bold, dim, italic, underline) become CSS classes. Other escape sequences (OSC titles and links,
DCS, cursor addressing, screen erase, private modes) are dropped whole; other C0 controls and
DEL are shown in caret notation, dimmed (NUL as ^@), C1 controls and invalid UTF-8 as U+FFFD;
BEL is dropped. UTF-8 is decoded incrementally, so a character cut between two 16 KB chunks
stays whole, and an escape sequence cut there is still one sequence.

A line is identified by the number of the record that started it on this terminal, so the
page's first render and its live updates name lines the same way; `take()` returns the lines
added and the lines changed since the last call. A line keeps at most `cap` characters for
display and counts the rest (`hidden`). Deterministic: the same records give the same lines.
"""

from __future__ import annotations

import codecs
import re
from collections import deque
from dataclasses import dataclass, field
from html import escape

from .logrecords import joins

KEEP_LINES = 200
LINE_CAP = 2000
MAX_STYLED_RUNS = 64  # spans per line; the rest of a line is rendered plain
MAX_PENDING_ESCAPE = 64

_PLAIN = re.compile(r"[^\x00-\x1f\x7f-\x9f]+")
_CSI = re.compile(r"\[([0-?]{0,32})([ -/]{0,4})([@-~])")
_ESC_OTHER = re.compile(r"[ -/]{0,4}[0-~]")
_INCOMPLETE_CSI = re.compile(r"\[[0-?]{0,32}[ -/]{0,4}\Z")
_INCOMPLETE_ESC = re.compile(r"[ -/]{0,4}\Z")
_STRING_END = re.compile(r"\x07|\x1b\\")
_STRING_STARTS = "]PX^_"  # OSC, DCS, SOS, PM, APC: skipped up to BEL or ST

# Style bits: foreground 0 (default) or 1 + colour (0-15), background likewise, then flags.
_BOLD, _DIM, _ITALIC, _UNDERLINE, _CONTROL = (1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14)
_FLAG_CLASSES = ((_BOLD, "bo"), (_DIM, "di"), (_ITALIC, "it"), (_UNDERLINE, "un"), (_CONTROL, "ctl"))
_class_cache: dict[int, str] = {}


def style_classes(style: int) -> str:
    """CSS classes of a style: f0-f15 (foreground), b0-b15 (background), bo, di, it, un, ctl."""
    classes = _class_cache.get(style)
    if classes is None:
        names = []
        if style & 31:
            names.append(f"f{(style & 31) - 1}")
        if (style >> 5) & 31:
            names.append(f"b{((style >> 5) & 31) - 1}")
        names += [name for bit, name in _FLAG_CLASSES if style & bit]
        classes = _class_cache[style] = " ".join(names)
    return classes


def _visible_control(char: str) -> str:
    """Caret notation, as `cat -v` shows controls (every font has it): ^@ for NUL, ^? for DEL."""
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 64)
    if code == 0x7F:
        return "^?"
    return "\ufffd"  # a C1 control


@dataclass(eq=False)
class Line:
    """One line of the terminal: its characters up to the cap, their styles (None while plain),
    and its width (the columns it reaches, beyond the cap too)."""

    id: int
    chars: list[str] | str = field(default_factory=list)
    styles: list[int] | None = None
    width: int = 0
    continued: bool = False  # the line started before what this terminal was fed
    sent: bool = False
    ts_ns: int = 0  # when its first record was written (Docker's timestamp)

    def write(self, column: int, text: str, style: int) -> None:
        chars = self.chars
        if isinstance(chars, str):
            chars = self.chars = list(chars)
        if column > len(chars):
            pad = column - len(chars)
            chars.extend(" " * pad)
            if self.styles is not None:
                self.styles.extend([0] * pad)
        chars[column : column + len(text)] = text
        if style and self.styles is None:
            self.styles = [0] * len(chars)
        if self.styles is not None:  # as long as chars: both grow the same way
            self.styles[column : column + len(text)] = [style] * len(text)

    def erase(self, start: int, stop: int | None) -> None:
        """Blank [start, stop) (stop None: to the end of the line, which then ends at start)."""
        chars = self.chars if isinstance(self.chars, list) else list(self.chars)
        self.chars = chars
        if stop is None:
            del chars[start:]
            if self.styles is not None:
                del self.styles[start:]
            self.width = min(self.width, start)
            return
        stop = min(stop, len(chars))
        if stop > start:
            chars[start:stop] = " " * (stop - start)
            if self.styles is not None:
                self.styles[start:stop] = [0] * (stop - start)

    def freeze(self) -> None:
        """No longer editable: keep the characters as one string."""
        if isinstance(self.chars, list):
            self.chars = "".join(self.chars)

    def hidden(self, cap: int) -> int:
        """Columns beyond the display cap."""
        return max(0, self.width - cap)

    @property
    def text(self) -> str:
        """The characters shown, without styles or markers."""
        return self.chars if isinstance(self.chars, str) else "".join(self.chars)

    def html(self, cap: int) -> str:
        """The line as HTML: escaped text, spans for styles, markers for what is not shown."""
        parts = ['<span class="more">…</span>'] if self.continued else []
        text = self.text
        styles = self.styles
        if styles is None or not any(styles):
            parts.append(escape(text))
        else:
            start, runs, n = 0, 0, len(text)
            while start < n:
                style = styles[start]
                stop = start + 1
                while stop < n and styles[stop] == style:
                    stop += 1
                piece = escape(text[start:stop])
                if style and runs < MAX_STYLED_RUNS:
                    parts.append(f'<span class="{style_classes(style)}">{piece}</span>')
                    runs += 1
                else:
                    parts.append(piece)
                start = stop
        hidden = self.hidden(cap)
        if hidden:
            parts.append(f'<span class="more"> … {hidden:,} more characters (full log)</span>')
        return "".join(parts)


@dataclass
class Changes:
    new: list[Line]  # lines added since the last take, oldest first
    changed: list[Line]  # lines taken before whose content changed since
    dropped: int  # lines added since the last take that were not kept (more than max_new)


class Terminal:
    def __init__(self, cap: int = LINE_CAP, keep: int = KEEP_LINES, max_new: int = 5000):
        self.cap, self.keep = cap, keep
        self.window: deque[Line] = deque()
        self.row = -1
        self.col = 0
        self.style = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._prev: tuple[int, bool, int] | None = None  # (ts, more, payload size) of the last record
        self._escape = ""  # an escape sequence cut at the end of the last record
        self._in_string = False  # inside an OSC/DCS/...: skipped up to its terminator
        self._new: deque[Line] = deque(maxlen=max_new)
        self._changed: dict[int, Line] = {}
        self._dropped = 0

    # -- input -------------------------------------------------------------------------------
    def feed(self, number: int, ts_ns: int, payload: bytes, more: bool, size: int | None = None) -> None:
        """One record (number: its record number, the id of a line it starts; size: the payload's
        size in the file, where only part of it is fed)."""
        if self.row < 0:
            self._append(number, ts_ns)
        elif not joins(self._prev, ts_ns):
            self._line_feed(number, ts_ns)
        self._write(self._decoder.decode(payload))
        self._prev = (ts_ns, more, len(payload) if size is None else size)

    def skip_columns(self, count: int) -> None:
        """Characters of the current line that are not fed (the middle of a huge line)."""
        self.col += count
        line = self.window[self.row]
        line.width = max(line.width, self.col)
        self._touch(line)

    def mark_continued(self) -> None:
        """The current line started before the first record fed."""
        if self.row >= 0:
            self.window[self.row].continued = True

    def adopt(self, line_id: int) -> None:
        """The first line goes on with a line the page already has (drawn by an earlier terminal
        before a skip): it takes that line's id and goes out as a change of it."""
        line = self.window[0]
        if line in self._new:
            self._new.remove(line)
        line.id, line.sent = line_id, True
        self._touch(line)

    @property
    def last_record(self) -> tuple[int, bool, int] | None:
        """(ts, more, payload size) of the last record fed."""
        return self._prev

    @property
    def cursor_line(self) -> Line | None:
        return self.window[self.row] if self.row >= 0 else None

    # -- output ------------------------------------------------------------------------------
    def take(self) -> Changes:
        new = list(self._new)
        self._new.clear()
        for line in new:
            line.sent = True
        changed = [line for line in self._changed.values() if line.sent]
        self._changed.clear()
        dropped, self._dropped = self._dropped, 0
        return Changes(new, changed, dropped)

    def screen(self) -> list[tuple[int, str]]:
        """The editable lines as (id, text)."""
        return [(line.id, line.text) for line in self.window]

    # -- lines -------------------------------------------------------------------------------
    def _append(self, number: int, ts_ns: int = 0) -> None:
        line = Line(number, ts_ns=ts_ns)
        self.window.append(line)
        if len(self.window) > self.keep:
            self.window.popleft().freeze()
        self.row = len(self.window) - 1
        self.col = 0
        if len(self._new) == self._new.maxlen:
            self._dropped += 1
        self._new.append(line)

    def _line_feed(self, number: int, ts_ns: int = 0) -> None:
        tail = self._decoder.decode(b"", final=True)  # a character cut by the end of the line
        self._decoder.reset()
        self._escape, self._in_string = "", False  # a sequence never spans lines here
        if tail:
            self._write(tail)
        if self.row < len(self.window) - 1:
            self.row += 1  # below a line the cursor went up from: that line, as on a terminal
            self.col = 0
        else:
            self._append(number, ts_ns)

    def _touch(self, line: Line) -> None:
        if line.sent:
            self._changed[id(line)] = line

    # -- characters --------------------------------------------------------------------------
    def _write(self, text: str) -> None:
        if self._escape:
            text, self._escape = self._escape + text, ""
        i, n = 0, len(text)
        while i < n:
            if self._in_string:
                end = _STRING_END.search(text, i)
                if end is None:
                    return
                self._in_string = False
                i = end.end()
                continue
            plain = _PLAIN.match(text, i)
            if plain:
                self._put(plain.group())
                i = plain.end()
                continue
            char = text[i]
            if char == "\x1b":
                i = self._escape_sequence(text, i)
                continue
            i += 1
            if char == "\r":
                self.col = 0
            elif char == "\b":
                self.col = max(0, self.col - 1)
            elif char == "\t":
                self.col = (self.col // 8 + 1) * 8
            elif char != "\x07":  # BEL: nothing to see
                self._put(_visible_control(char), _CONTROL)

    def _put(self, text: str, extra: int = 0) -> None:
        line = self.window[self.row]
        col = self.col
        if col < self.cap:
            line.write(col, text[: self.cap - col], self.style | extra)
        self.col = col + len(text)
        line.width = max(line.width, self.col)
        self._touch(line)

    def _escape_sequence(self, text: str, i: int) -> int:
        """Handle the sequence that starts with ESC at i; returns where the text goes on."""
        if i + 1 >= len(text):
            self._escape = "\x1b"
            return len(text)
        kind = text[i + 1]
        if kind == "[":
            csi = _CSI.match(text, i + 1)
            if csi:
                self._csi(csi.group(1), csi.group(3))
                return csi.end()
            if _INCOMPLETE_CSI.match(text, i + 1):  # cut by the end of the record
                self._escape = text[i:][:MAX_PENDING_ESCAPE]
                return len(text)
            return i + 2  # not a sequence: drop ESC [
        if kind in _STRING_STARTS:
            self._in_string = True
            return i + 2
        other = _ESC_OTHER.match(text, i + 1)
        if other:
            return other.end()  # charset selection, keypad modes, save/restore cursor...
        if _INCOMPLETE_ESC.match(text, i + 1):
            self._escape = text[i:][:MAX_PENDING_ESCAPE]
            return len(text)
        return i + 1

    def _csi(self, params: str, final: str) -> None:
        if params[:1] in ("<", "=", ">", "?"):
            return  # private modes (cursor visibility, bracketed paste...)
        values = [int(p[:6]) if p.isdigit() else (0 if p == "" else -1) for p in params.split(";")]
        n = max(1, values[0]) if values else 1
        if final == "m":
            self._sgr(values)
        elif final in "AF":
            self.row = max(0, self.row - n)
            if final == "F":
                self.col = 0
        elif final in "BE":
            self.row = min(len(self.window) - 1, self.row + n)
            if final == "E":
                self.col = 0
        elif final in "Ca":
            self.col += n
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final in "G`":
            self.col = n - 1
        elif final == "K":
            line = self.window[self.row]
            mode = values[0] if values else 0
            if mode == 0:
                line.erase(self.col, None)
            elif mode == 1:
                line.erase(0, self.col + 1)
            elif mode == 2:
                line.erase(0, None)
            self._touch(line)
        # Anything else (cursor addressing, erase in display, scrolling...) is ignored.

    def _sgr(self, values: list[int]) -> None:
        style = self.style
        values = values or [0]
        i = 0
        while i < len(values):
            p = values[i]
            if p == 0:
                style = 0
            elif p in (1, 2, 3, 4):
                style |= (_BOLD, _DIM, _ITALIC, _UNDERLINE)[p - 1]
            elif p == 22:
                style &= ~(_BOLD | _DIM)
            elif p == 23:
                style &= ~_ITALIC
            elif p == 24:
                style &= ~_UNDERLINE
            elif 30 <= p <= 37 or 90 <= p <= 97:
                style = (style & ~31) | (p - 30 if p < 90 else p - 90 + 8) + 1
            elif p == 39:
                style &= ~31
            elif 40 <= p <= 47 or 100 <= p <= 107:
                style = (style & ~(31 << 5)) | ((p - 40 if p < 100 else p - 100 + 8) + 1) << 5
            elif p == 49:
                style &= ~(31 << 5)
            elif p in (38, 48):
                mode = values[i + 1] if i + 1 < len(values) else -1
                if mode == 5 and i + 2 < len(values):
                    colour = values[i + 2]
                    if 0 <= colour < 16:
                        shift = 0 if p == 38 else 5
                        style = (style & ~(31 << shift)) | (colour + 1) << shift
                    i += 2
                elif mode == 2:
                    i += 4  # 24-bit colour: not rendered
            i += 1
        self.style = style
