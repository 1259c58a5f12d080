"""The server's output split into lines as they arrive, a carriage return ending one too.

tqdm (SGLang's weight-shard and graph-capture meters) redraws its line with "\\r<text>" and
writes "\\n" only when the meter closes: read by "\\n" alone, a 30-minute load's progress would
arrive as one line at its end. Here each redraw is a line, and one is handed on as soon as its
write is read (a redraw comes in one write), not when the next redraw begins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import IO

_END = re.compile(rb"\r\n|\r|\n")
CHUNK_BYTES = 1 << 16


def split_lines(read: Callable[[], bytes]) -> Iterator[bytes]:
    """Lines from `read` (b"" at the end), without their "\\n", "\\r\\n" or "\\r".

    An empty line ended by a lone "\\r" is no line: it is how a redraw starts. A lone "\\r" at
    the end of what was read waits for the next read, which may bring the "\\n" of a "\\r\\n".
    """
    held = b""
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
            if line or end != b"\r":
                yield line
            pos, redrawn = match.end(), end == b"\r"
        held = data[pos:]
        if held and redrawn and not held.endswith(b"\r"):
            yield held
            held, redrawn, handed = b"", False, True
    held = held.rstrip(b"\r")
    if held:
        yield held


def output_lines(stream: IO[bytes], chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The lines of a pipe (`stream` must have buffered nothing yet: it is read by its fd)."""
    fd = stream.fileno()
    return split_lines(lambda: os.read(fd, chunk_bytes))
