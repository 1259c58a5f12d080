"""The server's output split into lines as they arrive, a carriage return ending one too, and
no line longer than a bound.

tqdm (SGLang's weight-shard and graph-capture meters) redraws its line with "\\r<text>" and
writes "\\n" only when the meter closes: read by "\\n" alone, a 30-minute load's progress would
arrive as one line at its end. Here each redraw is a line, and one is handed on as soon as its
write is read (a redraw comes in one write), not when the next redraw begins.

A line is at most `max_line_bytes` long (core/clip.py): past that only its head and a rolling
tail are held, the bytes between are counted and dropped as they are read, and the line is
handed on at its end as head, mark, tail. So a megabyte line (a client's prompt in
`--log-requests`, a dump without a newline) costs a bounded buffer and one short line to parse
and mask, and the work per byte read stays constant.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import IO

from supervisor.core.clip import cut_mark, split_bound

_END = re.compile(rb"\r\n|\r|\n")
CHUNK_BYTES = 1 << 16
# 16 KiB: SGLang's longest own line (its server_args dump) fits; so does a whole line in the
# journal (journald's LineMax= is 48 KiB) once JSON-escaped.
MAX_LINE_BYTES = 16 << 10


class _LongLine:
    """A line past the bound: its head, its last bytes, and how many between were dropped."""

    def __init__(self, max_line_bytes: int) -> None:
        self.head_max, self.tail_max = split_bound(max_line_bytes)
        self.head = b""
        self.tail = b""
        self.cut = 0

    def add(self, piece: bytes) -> None:
        room = self.head_max - len(self.head)
        if room > 0:
            self.head, piece = self.head + piece[:room], piece[room:]
        tail = self.tail + piece
        if len(tail) > self.tail_max:
            self.cut += len(tail) - self.tail_max
            tail = tail[-self.tail_max :]
        self.tail = tail

    def close(self, rest: bytes) -> bytes:
        """The whole line as handed on: head, mark, tail (cut at whole UTF-8 characters)."""
        self.add(rest)
        head, tail = _whole_head(self.head), _whole_tail(self.tail)
        cut = self.cut + len(self.head) - len(head) + len(self.tail) - len(tail)
        if not cut:
            return head + tail
        return head + cut_mark(cut, "bytes").encode() + tail


def _whole_head(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence its cut left incomplete at the end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last lead (or ASCII) byte
            length = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if length <= back else data[:-back]
    return data


def _whole_tail(data: bytes) -> bytes:
    """`data` without the continuation bytes of a character its cut began inside."""
    start = 0
    while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


def split_lines(read: Callable[[], bytes], max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Lines from `read` (b"" at the end), without their "\\n", "\\r\\n" or "\\r", none longer
    than `max_line_bytes` plus the cut mark.

    An empty line ended by a lone "\\r" is no line: it is how a redraw starts. A lone "\\r" at
    the end of what was read waits for the next read, which may bring the "\\n" of a "\\r\\n".
    """
    held = b""  # the current line's bytes not yet handed on: at most max_line_bytes + a read
    long: _LongLine | None = None  # the current line went past the bound
    redrawn = False  # `held` began after a lone "\r": a redraw, complete as it was written
    handed = False  # a redraw was handed on before its end: a "\n" now only ends it
    while chunk := read():
        data, pos = held + chunk, 0
        if handed and (lf := re.match(rb"\r?\n", data)):
            pos = lf.end()
        handed = False
        for match in _END.finditer(data, pos):
            end = match.group()
            if end == b"\r" and match.end() == len(data):
                break
            line = data[pos : match.start()]
            if long is not None:
                line, long = long.close(line), None
            else:
                line = _bounded(line, max_line_bytes)
            if line or end != b"\r":
                yield line
            pos, redrawn = match.end(), end == b"\r"
        held = data[pos:]
        if held and redrawn and not held.endswith(b"\r"):
            yield long.close(held) if long is not None else _bounded(held, max_line_bytes)
            held, long, redrawn, handed = b"", None, False, True
        elif len(held) > max_line_bytes:
            long = long or _LongLine(max_line_bytes)
            cr = b"\r" if held.endswith(b"\r") else b""  # kept: it may begin a "\r\n"
            long.add(held[: len(held) - len(cr)])
            held = cr
    held = held.rstrip(b"\r")
    if long is not None:
        yield long.close(held)
    elif held:
        yield _bounded(held, max_line_bytes)


def _bounded(line: bytes, max_line_bytes: int) -> bytes:
    if len(line) <= max_line_bytes:
        return line
    return _LongLine(max_line_bytes).close(line)


def output_lines(stream: IO[bytes], chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The lines of a pipe (`stream` must have buffered nothing yet: it is read by its fd)."""
    fd = stream.fileno()
    return split_lines(lambda: os.read(fd, chunk_bytes))
