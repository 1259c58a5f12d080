"""core.policy: synthetic readings on a fake timeline (no processes, no clock, no sleeps)."""

from __future__ import annotations

import dataclasses

import pytest

from supervisor.core.policy import (
    Level,
    Limits,
    Reading,
    Verdict,
    decide,
    growth_rates,
    next_interval_s,
    tree_kill_line,
)

GB = 10**9
GiB = 2**30

# A 449 GB host: levels in bytes only so the numbers below are easy to follow.
LIMITS = Limits(
    warn=Level(bytes_=8 * GB),
    terminate=Level(bytes_=4 * GB),
    kill=Level(bytes_=2 * GB),
    tree_budget_bytes=380 * GB,
    tree_kill_bytes=420 * GB,
    warn_ticks=3,
)


def r(t: float, avail_gb: float, tree_gb: float = 300.0, psi_full: float | None = None) -> Reading:
    return Reading(
        t_s=t,
        available_bytes=int(avail_gb * GB),
        tree_charged_bytes=int(tree_gb * GB),
        psi_full_avg10=psi_full,
    )


def test_plenty_of_memory_is_ok_and_polls_slowly():
    d = decide([r(0, 100)], LIMITS)
    assert d.verdict is Verdict.OK
    assert d.streak == 0
    assert d.next_interval_s == 1.0


def test_at_the_kill_level_kills_without_any_streak():
    d = decide([r(0, 2)], LIMITS)
    assert d.verdict is Verdict.KILL
    assert not d.predicted
    assert "kill level" in d.reason


def test_the_tree_over_budget_plus_margin_is_killed_even_with_free_host_memory():
    d = decide([r(0, 200, tree_gb=420)], LIMITS)
    assert d.verdict is Verdict.KILL
    assert "budget plus margin" in d.reason


def test_below_terminate_but_above_kill_terminates():
    assert decide([r(0, 3.5)], LIMITS).verdict is Verdict.TERMINATE


def test_terminate_grace_expiry_escalates_to_kill():
    assert decide([r(10, 3.5)], LIMITS, terminated_at_s=6.0).verdict is Verdict.TERMINATE
    escalated = decide([r(11, 3.5)], LIMITS, terminated_at_s=6.0)
    assert escalated.verdict is Verdict.KILL
    assert "grace" in escalated.reason


def test_warn_needs_consecutive_breaches_and_a_good_tick_resets_the_streak():
    streak = 0
    verdicts = []
    for t, avail in enumerate([7, 7, 7, 50, 7]):
        d = decide([r(t, avail)], LIMITS, streak=streak)
        streak = d.streak
        verdicts.append(d.verdict)
    assert verdicts == [Verdict.OK, Verdict.OK, Verdict.WARN, Verdict.OK, Verdict.OK]
    assert streak == 1


def test_tree_above_expected_total_and_memory_pressure_count_as_warn_breaches():
    d = decide([r(0, 100, tree_gb=390)], LIMITS, streak=2)
    assert d.verdict is Verdict.WARN
    assert "expected" in d.reason
    p = decide([r(0, 100, psi_full=55.0)], LIMITS, streak=2)
    assert p.verdict is Verdict.WARN
    assert "pressure" in p.reason


def test_a_fast_ramp_is_killed_before_it_crosses_the_kill_level():
    """6 GB/s with 2.2 GB of headroom left: the line is 33 ms away, closer than the next tick."""
    history = [r(0.0, 4.0), r(0.05, 3.7), r(0.10, 3.4), r(0.15, 3.1), r(0.2, 2.8), r(0.25, 2.5)]
    # Sanity: without the trend the fixed line has not been reached yet.
    assert history[-1].available_bytes > LIMITS.kill.resolve(0)
    d = decide(history, LIMITS)
    assert d.verdict is Verdict.KILL
    assert d.predicted
    assert d.available_drop_bytes_per_s == pytest.approx(6 * GB, rel=0.01)


def test_a_growing_tree_is_killed_before_it_crosses_budget_plus_margin():
    history = [r(0.0, 100, tree_gb=419.0), r(0.1, 100, tree_gb=419.5)]
    d = decide(history, LIMITS)
    assert d.verdict is Verdict.KILL
    assert d.predicted
    assert d.tree_growth_bytes_per_s == pytest.approx(5 * GB)


def test_a_re_read_moments_after_a_tick_does_not_hide_the_ramp():
    """Ticks 1 s apart saw 9 GB/s; the re-read before the kill comes 6 ms later, unchanged."""
    history = [r(4.0, 15.8), r(5.0, 6.8), r(5.006, 6.8)]
    d = decide(history, LIMITS)
    assert d.verdict is Verdict.KILL
    assert d.predicted
    assert d.available_drop_bytes_per_s == pytest.approx(9 * GB, rel=0.01)


def test_fast_tree_growth_below_the_expected_total_is_the_load_not_a_leak():
    """Pools pinned at 200 GB/s during startup: no projection until past the budget."""
    loading = [r(0.0, 300, tree_gb=300.0), r(0.1, 280, tree_gb=320.0)]
    assert decide(loading, LIMITS).verdict is Verdict.OK
    past = [r(0.0, 100, tree_gb=370.0), r(0.1, 80, tree_gb=390.0)]
    d = decide(past, LIMITS)
    assert d.verdict is Verdict.KILL
    assert d.predicted


def test_pools_pinned_fast_up_to_the_plan_do_not_project_past_it():
    """The load pins 40 GB/s and will stop at the expected 380 GB, leaving 9 GB: no kill. The
    same drop from another process (the tree not growing) is projected in full."""
    loading = [r(0.0, 49.0, tree_gb=330.0), r(0.1, 45.0, tree_gb=334.0)]
    assert decide(loading, LIMITS).verdict is Verdict.OK
    foreign = [r(0.0, 6.0, tree_gb=334.0), r(0.1, 5.0, tree_gb=334.0)]
    d = decide(foreign, LIMITS)
    assert d.verdict is Verdict.KILL
    assert d.predicted


def test_a_slow_ramp_far_from_the_line_is_not_killed_by_the_trend():
    history = [r(0.0, 50.0), r(1.0, 49.5)]
    assert decide(history, LIMITS).verdict is Verdict.OK


def test_mmapped_file_pages_are_not_part_of_the_readings_so_they_cannot_trigger():
    """The shell charges RssAnon+RssShmem; huge RssFile shows up as available memory instead."""
    d = decide([r(0, 300, tree_gb=10)], LIMITS)
    assert d.verdict is Verdict.OK


def test_interval_shrinks_with_headroom_and_is_clamped():
    assert next_interval_s(100 * GB, 6 * GB, 0.05, 1.0) == 1.0
    assert next_interval_s(3 * GB, 6 * GB, 0.05, 1.0) == pytest.approx(0.5)
    assert next_interval_s(0.1 * GB, 6 * GB, 0.05, 1.0) == 0.05
    assert next_interval_s(-1, 6 * GB, 0.05, 1.0) == 0.05
    assert next_interval_s(10, 0, 0.05, 1.0) == 1.0
    near = decide([r(0, 3.0)], dataclasses.replace(LIMITS, terminate=Level(bytes_=GB)))
    assert near.next_interval_s == pytest.approx(1 * GB / (6 * GB))


def test_a_measured_ramp_faster_than_the_assumed_worst_shortens_the_interval():
    slow = dataclasses.replace(LIMITS, worst_ramp_bytes_per_s=1 * GB)
    history = [r(0.0, 4.5), r(0.5, 3.5)]  # 2 GB/s measured, 1.5 GB above the kill level
    assert decide(history, slow).next_interval_s == pytest.approx(0.75)
    assert decide(history[-1:], slow).next_interval_s == 1.0


def test_growth_rate_uses_the_window_and_ignores_readings_older_than_it():
    history = [r(0.0, 100), r(5.0, 10), r(5.5, 9.5), r(6.0, 9.0)]
    drop, growth = growth_rates(history, window_s=1.0)
    assert drop == pytest.approx(1 * GB)
    assert growth == 0.0
    assert growth_rates(history[:1], 1.0) == (0.0, 0.0)
    assert growth_rates([r(1.0, 5), r(1.0, 4)], 1.0) == (0.0, 0.0)
    # A ramp that just started shows in the short slope even inside a long window.
    onset = [r(0.0, 50), r(0.5, 50), r(0.875, 50), r(1.0, 49.25)]
    assert growth_rates(onset, 1.0)[0] == pytest.approx(6 * GB)
    # Memory coming back is not negative growth.
    assert growth_rates([r(0.0, 5), r(1.0, 9)], 1.0) == (0.0, 0.0)


def test_percent_levels_use_available_plus_the_tree_as_base_and_the_lower_form_wins():
    level = Level(bytes_=5 * GB, percent=1.0)
    assert level.resolve(100 * GB) == 1 * GB
    assert level.resolve(1000 * GB) == 5 * GB
    assert Level().resolve(100 * GB) == 0
    limits = Limits(warn=Level(percent=10.0), terminate=Level(percent=5.0), kill=Level(percent=2.0))
    # base = 4 + 196 = 200 GB -> kill at 4 GB.
    d = decide([r(0, 4.0, tree_gb=196)], limits)
    assert d.kill_bytes == 4 * GB
    assert d.base_bytes == 200 * GB
    assert d.verdict is Verdict.KILL
    assert d.thresholds()["kill_available_bytes"] == 4 * GB


def test_tree_kill_line_takes_the_larger_margin():
    assert tree_kill_line(400 * GB, 10.0, 8 * GiB) == 440 * GB
    assert tree_kill_line(10 * GB, 10.0, 8 * GiB) == 10 * GB + 8 * GiB
