"""The followed log's framing (jobs/runtime/logframes.py): Docker's multiplexed frames inside HTTP
chunks, taken apart from blocks of bytes as the socket returns them. Every way a read can cut
the stream (inside a chunk's size line, its data, its CRLF, a frame's header or payload) gives
the same frames, in order, nothing lost or doubled."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from jobs.runtime.logframes import frames_in_blocks

FRAMES = [b"2026-12-01T00:00:00.000000001Z one\n", b"2026-12-01T00:00:00.000000002Z two", b"x" * 300, b"\x00\xff\r\n"]


def multiplexed(frames: list[bytes], stream: int = 1) -> bytes:
    return b"".join(struct.pack(">BxxxL", stream, len(f)) + f for f in frames)


def chunked(body_parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in body_parts) + b"0\r\n\r\n"


class Reads:
    """A socket file whose read1 returns the given pieces, one per call, then b"" (closed)."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = list(pieces)

    def read1(self, size: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def response(pieces: list[bytes], chunked_body: bool = True):
    reads = Reads(pieces)
    return SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(chunked=chunked_body, fp=reads), read1=reads.read1))


def frames_of(pieces: list[bytes], chunked_body: bool = True) -> list[bytes]:
    return [frame for block in frames_in_blocks(response(pieces, chunked_body)) for frame in block]


def test_a_chunk_per_frame_read_whole():
    body = chunked([multiplexed([f]) for f in FRAMES])
    assert frames_of([body]) == FRAMES


@pytest.mark.parametrize("chunk_per_frame", [True, False])
def test_every_cut_of_the_stream_gives_the_same_frames(chunk_per_frame):
    parts = [multiplexed([f], stream=1 + i % 2) for i, f in enumerate(FRAMES)]
    body = chunked(parts if chunk_per_frame else [b"".join(parts)])
    for cut in range(1, len(body)):
        assert frames_of([body[:cut], body[cut:]]) == FRAMES, cut
    for second in range(2, len(body), 7):  # and in three pieces
        assert frames_of([body[:1], body[1:second], body[second:]]) == FRAMES, second


def test_a_frame_split_over_chunks():
    whole = multiplexed(FRAMES)
    body = chunked([whole[:5], whole[5:40], whole[40:]])
    assert frames_of([body]) == FRAMES


def test_a_body_that_is_not_chunked():
    whole = multiplexed(FRAMES)
    assert frames_of([whole[:3], whole[3:50], whole[50:]], chunked_body=False) == FRAMES


def test_a_chunked_stream_cut_before_its_last_chunk_gives_the_frames_before_the_cut_then_raises():
    """The engine went away mid-answer: not the log's end (an ended container's rest of the log,
    read once, would have been taken as whole with its last lines missing)."""
    body = chunked([multiplexed([f]) for f in FRAMES])
    got: list[bytes] = []
    with pytest.raises(ConnectionError):
        for block in frames_in_blocks(response([body[: len(body) // 2]])):
            got.extend(block)
    assert 0 < len(got) < len(FRAMES) and got == FRAMES[: len(got)]
    with pytest.raises(ConnectionError):  # every frame came, the last (empty) chunk did not
        frames_of([body[: -len(b"0\r\n\r\n")]])
    assert frames_of([body]) == FRAMES
