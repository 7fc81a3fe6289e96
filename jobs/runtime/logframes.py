"""A followed container log's bytes taken apart: the HTTP chunks Docker sends and the
multiplexed frames inside them (`<stream><3 bytes><length>` then `<timestamp> <payload>`),
from blocks of what each socket read returned (engine.log_stream reads them). The SDK reads
a frame at a time, two reads through urllib3 each: most of a follower's cost per line."""

from __future__ import annotations

import struct
from collections.abc import Iterator

FRAME_HEADER = struct.Struct(">BxxxL")  # stream (1 stdout, 2 stderr), 3 bytes padding, length
LOG_READ_BYTES = 256 * 1024


def body_blocks(response) -> Iterator[bytes]:
    """The response's body as it arrives, in blocks of what one read returned (up to
    LOG_READ_BYTES, never waiting for more). Docker sends a followed log chunked, a chunk per
    frame: urllib3 decodes one chunk per read, so the chunks are taken apart here. A chunked
    body whose connection ends before its last chunk raises ConnectionError after the blocks
    before the break (the engine went away mid-answer: not the log's end)."""
    http_response = response.raw._fp  # http.client's response: nothing of the body read yet
    if not http_response.chunked:
        while data := response.raw.read1(LOG_READ_BYTES):
            yield data
        return
    socket_file = http_response.fp
    pending = bytearray()
    left = 0  # data bytes of the current chunk still to come
    crlf = 0  # bytes of the CRLF after a chunk's data still to skip
    while data := socket_file.read1(LOG_READ_BYTES):
        pending += data
        body = bytearray()
        position, size = 0, len(pending)
        while position < size:
            if left:
                take = min(left, size - position)
                body += pending[position : position + take]
                position += take
                left -= take
                if left:
                    break
                crlf = 2
            if crlf:
                skip = min(crlf, size - position)
                position += skip
                crlf -= skip
                if crlf:
                    break
            line_end = pending.find(b"\r\n", position)
            if line_end < 0:
                break
            chunk_size = int(bytes(pending[position:line_end]).split(b";")[0].strip() or b"0", 16)
            if chunk_size == 0:  # the last chunk: the stream ended
                if body:
                    yield bytes(body)
                return
            position, left = line_end + 2, chunk_size
        del pending[:position]
        if body:
            yield bytes(body)
    raise ConnectionError("the engine's log stream broke off before its end")


def frames_in_blocks(response) -> Iterator[list[bytes]]:
    """Docker's multiplexed stream, split into frames: what one read returned, as a list; a
    frame cut by a read waits for the rest. The stream is Docker's, not the job's: a frame is at
    most Docker's 16 KB log message."""
    pending = bytearray()
    for data in body_blocks(response):
        pending += data
        frames: list[bytes] = []
        position, size = 0, len(pending)
        while size - position >= FRAME_HEADER.size:
            length = FRAME_HEADER.unpack_from(pending, position)[1]
            end = position + FRAME_HEADER.size + length
            if end > size:
                break
            if length:
                frames.append(bytes(pending[position + FRAME_HEADER.size : end]))
            position = end
        del pending[:position]
        if frames:
            yield frames
