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


# -- the bound on a line --------------------------------------------------------------------

CAP = 1000  # a small bound for the tests: head 750 bytes, tail 250


def capped(*chunks: bytes) -> list[bytes]:
    reads: Iterator[bytes] = iter(chunks)
    return list(split_lines(lambda: next(reads, b""), max_line_bytes=CAP))


def test_a_line_past_the_bound_keeps_its_head_and_tail_and_says_how_much_was_cut():
    line = b"H" * 5000 + b"T" * 5000
    (out,) = capped(line + b"\n")
    head, _, rest = out.partition(b" \xe2\x80\xa6[cut ")
    count, _, tail = rest.partition(b" bytes]\xe2\x80\xa6 ")
    assert head == b"H" * 750
    assert tail == b"T" * 250
    assert int(count) == len(line) - 750 - 250


def test_a_line_at_the_bound_is_whole():
    assert capped(b"x" * CAP + b"\n", b"y\n") == [b"x" * CAP, b"y"]


def test_a_long_line_read_in_pieces_is_cut_the_same_and_the_next_line_is_whole():
    line = bytes(range(97, 123)) * 400  # 10,400 bytes, no end until the last read
    pieces = [line[i : i + 64] for i in range(0, len(line), 64)]
    out = capped(*pieces, b"\r\n", b"next\n")
    assert out == [
        line[:750] + f" …[cut {len(line) - 1000} bytes]… ".encode() + line[-250:],
        b"next",
    ]


def test_a_long_line_whose_crlf_is_split_over_two_reads_is_one_line():
    assert len(capped(b"x" * 3000 + b"\r", b"\nafter\n")) == 2


def test_a_long_line_at_the_end_of_the_output_is_handed_on_cut():
    (out,) = capped(b"z" * 4000)
    assert out.startswith(b"z" * 750)
    assert out.endswith(b"z" * 250)
    assert b"[cut 3000 bytes]" in out


def test_a_long_redraw_is_cut_too():
    out = capped(b"\r" + b"r" * 3000 + b"\r" + b"s" * 10)
    assert [len(line) <= CAP + 40 for line in out] == [True, True]
    assert out[1] == b"s" * 10


def test_a_cut_never_splits_a_utf8_character():
    line = "漢字かな交じり文".encode() * 500  # three bytes a character
    (out,) = capped(line + b"\n")
    text = out.decode("utf-8")  # strict: no half character at either side of the mark
    head, _, tail = text.partition(" …[cut ")
    assert set(head) <= set("漢字かな交じり文")
    assert set(tail.partition("]… ")[2]) <= set("漢字かな交じり文")


def test_what_is_held_for_a_line_without_an_end_stays_bounded():
    """16 MiB of one line in 64 KiB reads: the splitter holds about one read and the cap, never
    the line (allocations traced, no time measured)."""
    import tracemalloc

    chunk = b"w" * (64 << 10)
    reads = iter([chunk] * 256 + [b"\n"])
    tracemalloc.start()
    try:
        out = list(split_lines(lambda: next(reads, b"")))
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out) == 1
    assert len(out[0]) < (17 << 10)
    assert peak < 1 << 20, f"{peak} bytes held for one line"
