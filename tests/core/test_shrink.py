"""core.shrink: the next --hicache-size after a memory kill."""

from __future__ import annotations

import pytest

from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.shrink import current_hicache_gb, decide_shrink

GB = 10**9
BASE = ["--model-path", "m", "--tp-size", "8", "--enable-hierarchical-cache"]


@pytest.mark.parametrize(
    ("size", "expected"),
    [(40, 30), (100, 75), (3, 2), (2, 1)],
)
def test_size_mode_shrinks_by_the_factor_and_always_by_at_least_one_gb(size, expected):
    plan = parse_launch_args([*BASE, "--hicache-size", str(size)])
    d = decide_shrink(plan)
    assert d.size_gb == expected
    assert d.previous_gb == size
    assert f"{size} -> {expected}" in d.reason


def test_never_below_the_minimum_and_reports_it():
    plan = parse_launch_args([*BASE, "--hicache-size", "12"])
    d = decide_shrink(plan, min_size_gb=10)
    assert d.size_gb == 10
    assert d.at_minimum
    again = decide_shrink(plan, override_gb=10, min_size_gb=10)
    assert again.size_gb == 10
    assert again.at_minimum
    assert "minimum" in again.reason


def test_an_earlier_override_is_shrunk_again_not_the_original_flag():
    plan = parse_launch_args([*BASE, "--hicache-size", "40"])
    assert decide_shrink(plan, override_gb=30).size_gb == 22


def test_a_ratio_is_converted_to_its_size_first():
    plan = parse_launch_args([*BASE, "--hicache-ratio", "2.0"])
    assert current_hicache_gb(plan, 96_500_000_000) == 96
    d = decide_shrink(plan, pool_bytes_per_rank=96_500_000_000, shrink_factor=0.5)
    assert d.size_gb == 48


def test_an_unknown_pool_size_or_no_hicache_means_no_shrink():
    ratio = parse_launch_args([*BASE, "--hicache-ratio", "2.0"])
    d = decide_shrink(ratio)
    assert d.size_gb is None
    assert "unknown" in d.reason
    plain = parse_launch_args(["--model-path", "m", "--hicache-size", "40"])
    none = decide_shrink(plain)
    assert none.size_gb is None
    assert "does not use" in none.reason
