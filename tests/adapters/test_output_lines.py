"""The server's output split into lines: "\\n", "\\r\\n" and tqdm's "\\r" redraws."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from supervisor.adapters.output_lines import output_lines, split_lines
from tests.waiting import wait_until


def lines(*chunks: bytes) -> list[bytes]:
    reads: Iterator[bytes] = iter(chunks)
    return list(split_lines(lambda: next(reads, b"")))


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ((b"a\nb\r\nc\n",), [b"a", b"b", b"c"]),
        ((b"a\r", b"\nb\n"), [b"a", b"b"]),  # a CRLF split over two reads is one end
        ((b"\n\n",), [b"", b""]),  # blank lines stay
        ((b"par", b"tial\n"), [b"partial"]),
        ((b"no end",), [b"no end"]),  # the last line, at EOF
        ((b"\rA 0%\rA 50%   \rA 100%\n",), [b"A 0%", b"A 50%   ", b"A 100%"]),
        # tqdm's close: the meter again, then "\n" in a write of its own.
        ((b"x\n\rA 10%", b"\rA 100%", b"\n", b"next\n"), [b"x", b"A 10%", b"A 100%", b"next"]),
        ((b"last\r",), [b"last"]),
    ],
)
def test_lines_end_at_newlines_and_at_redraws(chunks: tuple[bytes, ...], expected: list[bytes]):
    assert lines(*chunks) == expected


def test_a_redraw_is_handed_on_when_it_is_read_not_when_the_next_one_comes():
    read_fd, write_fd = os.pipe()
    got: list[bytes] = []
    with os.fdopen(read_fd, "rb") as stream:
        reader = threading.Thread(target=lambda: got.extend(output_lines(stream)), daemon=True)
        reader.start()
        os.write(write_fd, b"[TP0] Load weight begin.\n\rLoading shards:  12% Completed | 1/8")
        wait_until(lambda: len(got) == 2, timeout_s=10, what="the redraw as a line")
        assert got == [b"[TP0] Load weight begin.", b"Loading shards:  12% Completed | 1/8"]
        os.write(write_fd, b"\n")  # the meter closes: no empty line from its "\n"
        os.close(write_fd)
        reader.join(10)
    assert got == [b"[TP0] Load weight begin.", b"Loading shards:  12% Completed | 1/8"]
