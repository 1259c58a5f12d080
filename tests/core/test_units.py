"""Sizes and durations are parsed at the edge; units that would silently mislead are refused."""

from __future__ import annotations

import pytest

from supervisor.core.units import (
    GB,
    GiB,
    MiB,
    format_bytes,
    format_gb,
    format_seconds,
    parse_duration,
    parse_size,
    parse_token_count,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("445GB", 445 * GB),
        ("96GiB", 96 * GiB),
        ("512 MiB", 512 * MiB),
        ("1.5TB", 1_500 * GB),
        ("1024B", 1024),
        ("10gib", 10 * GiB),
        ("0", 0),
        (0, 0),
        ("0.0", 0),
    ],
)
def test_parse_size_accepts_decimal_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["96G", "12 furlongs", "-5GB", "GB", "", "1e400GB"])
def test_parse_size_refuses_unknown_or_ambiguous_units(text: str) -> None:
    with pytest.raises(ValueError, match=r"size|unit"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "shown"),
    [("445", "445"), (445, "445"), ("1024", "1024"), (1.5, "1.5"), (" 96 ", "96")],
)
def test_a_bare_number_is_not_taken_for_bytes(text: str | float, shown: str) -> None:
    """A bare 445 meant 445 GB far more often than 445 bytes: ask for the unit."""
    with pytest.raises(ValueError, match=f"^{shown} has no unit: write {shown}GB or {shown}GiB"):
        parse_size(text)


def test_parse_size_names_the_unknown_unit() -> None:
    with pytest.raises(ValueError, match="unknown size unit 'G'"):
        parse_size("96G")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10s", 10.0), ("500ms", 0.5), ("10min", 600.0), ("2h", 7200.0), ("7", 7.0), (1.5, 1.5)],
)
def test_parse_duration(text: str | float, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["10 fortnights", "-1", "soon", -3])
def test_parse_duration_refuses_nonsense(text: str | int) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("131072", 131072), ("128k", 128_000), ("1M", 1_000_000), ("1Ki", 1024)]
)
def test_parse_token_count_matches_sglang_suffixes(text: str, expected: int) -> None:
    assert parse_token_count(text) == expected


def test_parse_token_count_refuses_unknown_suffix() -> None:
    with pytest.raises(ValueError, match="suffix"):
        parse_token_count("12q")


def test_formatting_uses_the_named_unit() -> None:
    assert format_gb(48 * GB) == "48.0 GB"
    assert format_bytes(3 * GiB) == "3.0 GiB"
    assert format_bytes(12) == "12 B"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0 s"), (38, "38 s"), (312, "5 min 12 s"), (1800, "30 min"), (3720, "1 h 02 min")],
)
def test_durations_read_as_people_say_them(seconds: float, text: str):
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1e400s", "longer than 30 days"),  # was inf
        ("721h", "longer than 30 days"),
        (1e300, "longer than 30 days"),
        (10**400, "longer than 30 days"),  # compared before float(): no OverflowError
        (float("inf"), "longer than 30 days"),
        (float("nan"), "non-negative"),
        ("0.000000001s", "shorter than 1 ms"),  # a busy loop
        ("0.5ms", "shorter than 1 ms"),
    ],
)
def test_a_duration_is_0_or_1_ms_to_30_days(text: str | float, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0.0), ("0s", 0.0), ("1ms", 0.001), ("720h", 2592000.0)]
)
def test_the_bounds_of_a_duration_are_taken(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1e30GB", "1001TB", 10**400, 1e300, float("nan")])
def test_a_size_above_1_pb_is_out_of_range(text: str | float) -> None:
    with pytest.raises(ValueError, match="1 PB"):
        parse_size(text)


def test_1_pb_is_a_size() -> None:
    assert parse_size("1000TB") == 1000**5


def test_a_token_count_past_10_to_the_12_is_refused() -> None:
    assert parse_token_count("1" + "0" * 12) == 10**12
    with pytest.raises(ValueError, match="above 1,000,000,000,000"):
        parse_token_count("1" + "0" * 400)  # a float overflow before


def test_a_refused_value_is_quoted_short() -> None:
    with pytest.raises(ValueError, match="unknown duration unit") as exc:
        parse_duration("9" * 10_000 + "fortnights")
    assert len(str(exc.value)) < 400
    assert "10,010 characters" in str(exc.value)
