"""Limits on what an input may make the supervisor do: how deep a parsed document nests, how
much of a bad value an error message quotes.

Every parser of outside text (the TOML config, SGLang's `--config` YAML, config.json, a
safetensors header, the state files) holds its result to MAX_NESTING levels. Python's parsers
recurse once per level and end in a RecursionError (a traceback) near 1,000; and a document
that parses just under that limit still breaks whatever walks it next (a copy, `json.dumps` in
a log event). No real config nests more than a handful of levels.

An error message shows at most SHOWN_CHARS of the value it refuses: a 35 MB list quoted whole
is a 35 MB log line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_NESTING = 64
SHOWN_CHARS = 80
# One line of an error message, whatever it quotes: the head and the tail are kept.
MAX_LINE_CHARS = 2000


class TooDeep(ValueError):
    """A parsed document nests deeper than MAX_NESTING (or than its parser can recurse)."""


def nesting_problem(value: object, limit: int = MAX_NESTING) -> str | None:
    """Why `value` (lists and mappings of anything) nests too deep, or None.

    Iterative, so that checking a deep document cannot itself run out of stack. Made for the
    trees JSON and TOML parse: a container met twice is walked once, at the first depth it was
    met (YAML's shared nodes are measured over its node graph: adapters/sglang_config.py).
    """
    seen: set[int] = set()
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return f"nested more than {limit} levels deep"
        if id(item) in seen:
            continue
        seen.add(id(item))
        stack.extend((child, depth + 1) for child in children)
    return None


def parse_json(text: str | bytes) -> Any:
    """`json.loads`, with the nesting bounded.

    Raises:
        json.JSONDecodeError: not JSON (a ValueError).
        TooDeep: nested deeper than MAX_NESTING (a ValueError).
    """
    try:
        data = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested more than {MAX_NESTING} levels deep") from None
    problem = nesting_problem(data)
    if problem is not None:
        raise TooDeep(problem)
    return data


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` for a message, cut to `limit` characters (and how long it was).

    A long string is cut before it is quoted; anything else is quoted whole first, which the
    parsers' caps keep small (a 1 MiB file, MAX_NESTING, the YAML node budget, Python's own
    4,300 digits of an integer).
    """
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value):,} characters)"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


_PATH_MAX, _NAME_MAX = 4095, 255  # Linux's, in bytes


def path_problem(path: str) -> str | None:
    """Why the kernel would refuse `path` (ENAMETOOLONG from the first stat or open), or None."""
    encoded = path.encode("utf-8", "surrogateescape")
    if len(encoded) > _PATH_MAX:
        return f"is longer than {_PATH_MAX:,} bytes (PATH_MAX)"
    if any(len(part) > _NAME_MAX for part in encoded.split(b"/")):
        return f"has a name longer than {_NAME_MAX} bytes (NAME_MAX)"
    return None


def clip_line(line: str, limit: int = MAX_LINE_CHARS) -> str:
    """`line` with its middle cut out when longer than `limit`, saying how much went."""
    if len(line) <= limit:
        return line
    half = limit // 2
    return f"{line[:half]} … ({len(line) - 2 * half:,} characters cut) … {line[-half:]}"


def clip_message(message: str, limit: int = MAX_LINE_CHARS) -> str:
    """Every line of `message` clipped (a pre-flight's table keeps its lines)."""
    return "\n".join(clip_line(line, limit) for line in message.split("\n"))
