"""The limits every parser shares: nesting depth, how much of a value a message quotes."""

from __future__ import annotations

import json

import pytest

from supervisor.core.bounded import (
    MAX_NESTING,
    TooDeep,
    clip_line,
    clip_message,
    nesting_problem,
    parse_json,
    shown,
)


def nested(depth: int) -> object:
    """`depth` lists, one inside the other."""
    value: object = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nesting_up_to_the_limit_passes_and_one_more_does_not() -> None:
    assert nesting_problem(nested(MAX_NESTING)) is None
    assert nesting_problem(nested(MAX_NESTING + 1)) == "nested more than 64 levels deep"
    assert nesting_problem({"a": {"b": nested(MAX_NESTING - 1)}}) is not None


def test_a_deep_document_is_checked_without_running_out_of_stack() -> None:
    assert nesting_problem(nested(200_000)) is not None


def test_parse_json_refuses_a_document_python_cannot_recurse_through() -> None:
    with pytest.raises(TooDeep, match="nested more than 64 levels deep"):
        parse_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TooDeep):
        parse_json("[" * 70 + "]" * 70)  # parses, but past the limit
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(json.JSONDecodeError):
        parse_json("{bad")


def test_a_long_value_is_quoted_in_80_characters_and_its_length() -> None:
    assert shown("x" * 5) == "'xxxxx'"
    text = shown("y" * 1_000_000)
    assert len(text) < 120
    assert text.endswith("(1,000,000 characters)")
    assert shown(list(range(10_000))).endswith("characters)")


def test_a_line_keeps_its_head_and_tail() -> None:
    line = "head " + "x" * 100_000 + " tail"
    clipped = clip_line(line, 200)
    assert clipped.startswith("head ")
    assert clipped.endswith(" tail")
    assert "characters cut" in clipped
    assert len(clipped) < 300
    assert clip_line("short", 200) == "short"
    assert clip_message("a\n" + line, 200).split("\n")[0] == "a"
