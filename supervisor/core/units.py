"""Size, duration and token-count parsing and formatting.

SGLang mixes units: `--hicache-size` is decimal GB (1e9 B), its reserve is 10 GiB (2^30 B).
Everything inside the supervisor is bytes and seconds; human units exist only at the edges.
"""

from __future__ import annotations

import math
import re

from supervisor.core.bounded import shown

KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4
KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": KB,
    "mb": MB,
    "gb": GB,
    "tb": TB,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
}
_DURATION_UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "min": 60.0,
    "m": 60.0,
    "h": 3600.0,
}
_TOKEN_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

# The bounds every size and duration is held to, wherever it comes from (a config key, an option,
# a variable): past them a value is a typo or an attack, and the arithmetic or the OS calls that
# take it (timeouts in C `timeval`s, sd_notify's microseconds) would overflow or spin.
MAX_SIZE_BYTES = 1000**5  # 1 PB: no host, GPU or checkpoint of today comes near it
MAX_DURATION_S = 30 * 86400.0  # 30 days (720h): the longest wait or window that makes sense
MIN_DURATION_S = 0.001  # 1 ms: below it a period is a busy loop (0 stays 0: "off" or "at once")
MAX_TOKENS = 10**12  # far beyond any context length or KV pool


def parse_size(text: str | int | float) -> int:
    """Parse "445GB", "96GiB", "512MiB" or "1024B" into bytes.

    Raises:
        ValueError: the text is not a non-negative number with a known unit. A bare number is
            refused (a TOML `mem_available = 445` meant GB, not 445 bytes), but for zero, which
            is zero in every unit; bare "G"/"M" are refused too: an operator who means GiB and
            gets GB is off by 7 %. Above 1 PB (`1e30GB`) is out of range.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, (int, float)):
        if not 0 <= text <= MAX_SIZE_BYTES:  # nan, inf and 400-digit integers too
            raise ValueError(f"size must be 0 to 1 PB, with a unit, got {shown(text)}")
        return _unitless(f"{text:g}" if isinstance(text, float) else str(text))
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ValueError(f"not a size: {shown(text)} (examples: 445GB, 96GiB, 512MiB)")
    number, unit = match.groups()
    if not unit:
        return _unitless(number)
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown size unit {shown(unit)} in {shown(text)}: use B, KB, MB, GB, TB (powers of "
            "1000) or KiB, MiB, GiB, TiB (powers of 1024)"
        )
    value = float(number) * factor
    if not math.isfinite(value) or value > MAX_SIZE_BYTES:
        raise ValueError(f"size out of range: {shown(text)} is above 1 PB")
    return int(value)


def _unitless(number: str) -> int:
    """A size given without a unit: zero is zero, anything else must say its unit."""
    if float(number) == 0:
        return 0
    raise ValueError(f"{number} has no unit: write {number}GB or {number}GiB (or {number}B)")


def parse_duration(text: str | int | float) -> float:
    """Parse "10s", "500ms", "10min", "2h" or a plain number of seconds into seconds.

    Raises:
        ValueError: not a non-negative number with a known unit, longer than 30 days (`inf`,
            `1e400s`) or shorter than 1 ms but not 0.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if not text >= 0:  # nan too
            got = shown(text)
            raise ValueError(f"duration must be a non-negative number of seconds, got {got}")
        return _bounded_duration(text, shown(text))
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ValueError(f"not a duration: {shown(text)} (examples: 10s, 500ms, 10min, 2h)")
    number, unit = match.groups()
    factor = _DURATION_UNITS.get(unit.lower() or "s")
    if factor is None:
        raise ValueError(
            f"unknown duration unit {shown(unit)} in {shown(text)}: use ms, s, min or h"
        )
    return _bounded_duration(float(number) * factor, shown(text))


def _bounded_duration(seconds: float, shown: str) -> float:
    """`seconds` when it is 0 or within [1 ms, 30 days]; compared before any conversion, so a
    TOML integer of 400 digits is refused, not an OverflowError."""
    if not seconds <= MAX_DURATION_S:  # inf, and nan
        raise ValueError(f"duration {shown} is longer than 30 days (720h), the longest taken")
    if 0 < seconds < MIN_DURATION_S:
        raise ValueError(f"duration {shown} is shorter than 1 ms, the shortest taken (or 0)")
    return float(seconds)


def parse_token_count(text: str) -> int:
    """Parse SGLang's token counts: "131072", "128k", "1M", "1Ki".

    Raises:
        ValueError: not a non-negative integer count with a known suffix.
    """
    match = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$", text)
    if not match:
        raise ValueError(f"not a token count: {shown(text)}")
    number, suffix = match.groups()
    factor = _TOKEN_SUFFIXES.get(suffix.lower())
    if factor is None:
        raise ValueError(f"unknown token-count suffix {shown(suffix)} in {shown(text)}")
    count = float(number) * factor
    if not count <= MAX_TOKENS:  # inf too: 400 digits are a float overflow, not a count
        raise ValueError(f"token count {shown(text)} is above {MAX_TOKENS:,}")
    return int(count)


def format_gb(n_bytes: float) -> str:
    """Decimal gigabytes, the unit of `--hicache-size`: 48.0 GB."""
    return f"{n_bytes / GB:,.1f} GB"


def format_bytes(n_bytes: float) -> str:
    """A human size with the unit that keeps the number short (binary units)."""
    size = float(n_bytes)
    for unit, factor in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(size) >= factor:
            return f"{size / factor:,.1f} {unit}"
    return f"{int(size)} B"


def format_seconds(seconds: float) -> str:
    """A duration for people: "38 s", "5 min 12 s", "30 min", "1 h 02 min"."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
