"""Restart budget: 10 s doubling to 300 s, reset after a stable run, crash loop past the limit;
the same start failure twice before the server was ever ready ends the run."""

from __future__ import annotations

import pytest

from supervisor.core.backoff import (
    BackoffPolicy,
    RestartBudget,
    RunEnd,
    backoff_delay_s,
    decide_after_failure,
    delay_before_start_s,
    terminal_end,
)
from supervisor.core.classify import FailureKind


def test_delays_double_from_initial_up_to_the_cap():
    policy = BackoffPolicy()
    assert [backoff_delay_s(policy, n) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]


def test_failures_get_growing_delays_then_a_crash_loop_past_max_restarts():
    budget = RestartBudget(BackoffPolicy(max_restarts=3, restart_window_s=1800))
    delays = []
    for now in (0.0, 100.0, 200.0):
        budget, decision = budget.on_failure(now)
        assert not decision.give_up
        delays.append(decision.delay_s)
    assert delays == [10, 20, 40]
    budget, decision = budget.on_failure(300.0)
    assert decision.give_up
    assert decision.restarts_in_window == 3
    assert budget.total_restarts == 3


def test_restarts_older_than_the_window_do_not_count():
    budget = RestartBudget(BackoffPolicy(max_restarts=2, restart_window_s=100))
    budget, _ = budget.on_failure(0.0)
    budget, _ = budget.on_failure(50.0)
    budget, decision = budget.on_failure(101.0)  # the one at 0 s has left the window
    assert not decision.give_up
    assert decision.restarts_in_window == 1


def test_a_stable_run_resets_the_delay_but_not_before_stable_after():
    budget = RestartBudget(BackoffPolicy(stable_after_s=600, max_restarts=100))
    for now in (0.0, 1.0, 2.0):
        budget, decision = budget.on_failure(now)
    assert decision.delay_s == 40
    assert budget.on_healthy(healthy_since_s=10.0, now_s=609.0).streak == 3
    budget = budget.on_healthy(healthy_since_s=10.0, now_s=610.0)
    budget, decision = budget.on_failure(700.0)
    assert decision.delay_s == 10
    assert decision.attempt == 1


def test_zero_max_restarts_gives_up_at_the_first_failure():
    _, decision = RestartBudget(BackoffPolicy(max_restarts=0)).on_failure(0.0)
    assert decision.give_up


@pytest.mark.parametrize(("initial", "cap"), [(0.1, 0.4), (1.0, 1.0)])
def test_tiny_test_timings_follow_the_same_rule(initial, cap):
    policy = BackoffPolicy(initial_s=initial, max_s=cap)
    delays = [backoff_delay_s(policy, n) for n in (1, 2, 3, 4)]
    assert delays == [min(cap, initial * 2**k) for k in range(4)]


@pytest.mark.parametrize(
    ("kind", "end"),
    [
        (FailureKind.BAD_FLAGS, RunEnd.ARGS_REJECTED),
        (FailureKind.GPU_DIRTY, RunEnd.GPU_UNRECOVERABLE),
        (FailureKind.STARTUP_TIMEOUT, RunEnd.STARTUP_FAILED),
    ],
)
def test_failures_a_restart_cannot_help_end_the_run_without_spending_the_budget(kind, end):
    budget = RestartBudget(BackoffPolicy())
    after, decision = decide_after_failure(budget, kind, 0.0)
    assert decision.end is end
    assert after is budget


@pytest.mark.parametrize("kind", [k for k in FailureKind if terminal_end(k) is None])
def test_every_other_failure_is_restarted_and_counted(kind):
    after, decision = decide_after_failure(RestartBudget(BackoffPolicy()), kind, 0.0)
    assert decision.end is None
    assert decision.delay_s == 10
    assert after.total_restarts == 1


def test_a_crash_loop_ends_the_run_as_such():
    budget = RestartBudget(BackoffPolicy(max_restarts=1))
    budget, first = decide_after_failure(budget, FailureKind.RANK_CRASH, 0.0, was_ready=True)
    _, second = decide_after_failure(budget, FailureKind.RANK_CRASH, 1.0)
    assert first.end is None
    assert second.end is RunEnd.CRASH_LOOP


def test_the_same_failure_twice_before_ever_ready_ends_the_run_without_spending_the_budget():
    budget = RestartBudget(BackoffPolicy())
    budget, first = decide_after_failure(budget, FailureKind.RANK_CRASH, 0.0)
    after, second = decide_after_failure(budget, FailureKind.RANK_CRASH, 15.0)
    assert first.end is None
    assert second.end is RunEnd.START_REPEATED
    assert second.restarts_in_window == 1
    assert after is budget


def test_different_start_failures_in_a_row_are_restarted():
    budget = RestartBudget(BackoffPolicy())
    kinds = (FailureKind.RANK_CRASH, FailureKind.STARTUP_STALL, FailureKind.RANK_CRASH)
    for now, kind in enumerate(kinds):
        budget, decision = decide_after_failure(budget, kind, float(now))
        assert decision.end is None
    assert budget.total_restarts == 3


@pytest.mark.parametrize(
    "kinds",
    [
        (FailureKind.RANK_CRASH, FailureKind.EXITED_UNEXPECTEDLY),
        (FailureKind.EXITED_UNEXPECTEDLY, FailureKind.RANK_CRASH),
    ],
)
def test_a_rank_gone_and_the_server_exited_are_one_start_failure(kinds):
    """A rank dying at init is seen as the rank gone or as the main process's exit, whichever
    reading comes first: the same failure for the rule."""
    budget = RestartBudget(BackoffPolicy())
    budget, first = decide_after_failure(budget, kinds[0], 0.0)
    _, second = decide_after_failure(budget, kinds[1], 1.0)
    assert (first.end, second.end) == (None, RunEnd.START_REPEATED)


@pytest.mark.parametrize("kind", [FailureKind.MEMORY_KILL, FailureKind.KERNEL_OOM_KILLED])
def test_memory_kills_during_the_load_are_restarted_every_time(kind):
    """Restart-smaller goes on: each launch after a memory kill is a smaller one."""
    budget = RestartBudget(BackoffPolicy())
    for now in (0.0, 20.0, 60.0):
        budget, decision = decide_after_failure(budget, kind, now)
        assert decision.end is None
    # A memory kill in between breaks a run of the same start failure.
    budget = RestartBudget(BackoffPolicy())
    for now, failure in enumerate((FailureKind.RANK_CRASH, kind, FailureKind.RANK_CRASH)):
        budget, decision = decide_after_failure(budget, failure, float(now))
        assert decision.end is None


def test_once_the_server_was_ready_a_repeated_failure_is_only_counted():
    budget = RestartBudget(BackoffPolicy())
    budget, _ = decide_after_failure(budget, FailureKind.RANK_CRASH, 0.0, was_ready=True)
    budget, again = decide_after_failure(budget, FailureKind.RANK_CRASH, 50.0)
    budget, third = decide_after_failure(budget, FailureKind.RANK_CRASH, 100.0)
    assert (again.end, third.end) == (None, None)
    # Ready in between, seen by the loop while it watched (on_healthy), counts the same.
    budget = RestartBudget(BackoffPolicy())
    budget, _ = decide_after_failure(budget, FailureKind.RANK_CRASH, 0.0)
    budget = budget.on_healthy(healthy_since_s=20.0, now_s=21.0)
    _, decision = decide_after_failure(budget, FailureKind.RANK_CRASH, 30.0)
    assert decision.end is None


def test_restarts_in_window_counts_only_the_window():
    budget = RestartBudget(BackoffPolicy(restart_window_s=100), restart_times_s=(0.0, 50.0, 90.0))
    assert budget.restarts_in_window(99.0) == 3
    assert budget.restarts_in_window(100.0) == 2
    assert budget.restarts_in_window(200.0) == 0


def test_the_delay_before_a_start_is_what_the_last_failure_earned_less_the_time_since():
    policy = BackoffPolicy(initial_s=10.0, max_s=300.0, restart_window_s=1800.0)
    assert delay_before_start_s(RestartBudget(policy), 1000.0) == 0.0
    one = RestartBudget(policy, restart_times_s=(997.0,))
    assert delay_before_start_s(one, 1000.0) == 7.0  # 10 s earned, 3 s gone
    three = RestartBudget(policy, restart_times_s=(900.0, 950.0, 990.0))
    assert delay_before_start_s(three, 1000.0) == 30.0  # 40 s earned, 10 s gone
    assert delay_before_start_s(one, 1100.0) == 0.0  # long gone
    outside = RestartBudget(policy, restart_times_s=(-900.0,))
    assert delay_before_start_s(outside, 1000.0) == 0.0  # outside the window: forgotten
