"""Text cut to a bound before anything reads it: the head and the tail kept, the middle replaced
by a mark that says how much is missing (" …[cut 981234 bytes]… ").

Everything the supervised server prints, and every value a log event carries, is parsed and
masked by patterns; however linear they are, their work grows with the text. A line is cut
where it is read (adapters/output_lines.py, in bytes, so that a line without an end is never
held whole) and an event value where it is logged (supervisor/log.py, in characters). The head
is the larger part: it says what the line is (a logger's prefix, a request's start); the tail
says how it ended (an exception's last words).
"""

from __future__ import annotations

import re

HEAD_SHARE = 0.75  # of what is kept, the head's part; the rest is the tail
_MARK = re.compile(r" …\[cut [0-9]+ (?:bytes|chars)\]… ")


def cut_mark(count: int, unit: str) -> str:
    """The mark that stands for `count` cut `unit` ("bytes" or "chars")."""
    return f" …[cut {count} {unit}]… "


def split_bound(max_kept: int) -> tuple[int, int]:
    """How many of `max_kept` units the head keeps, and how many the tail."""
    head = int(max_kept * HEAD_SHARE)
    return head, max_kept - head


def clip(text: str, max_chars: int) -> str:
    """`text` when it has at most `max_chars` characters, else its head and tail around a mark."""
    if len(text) <= max_chars:
        return text
    head, tail = split_bound(max_chars)
    cut = len(text) - head - tail
    return text[:head] + cut_mark(cut, "chars") + text[len(text) - tail :]


def cut_marks(text: str) -> list[tuple[int, int]]:
    """Where the marks of `clip` and of the line splitter are in `text`: (start, end) each."""
    if "…[cut " not in text:
        return []
    return [m.span() for m in _MARK.finditer(text)]
