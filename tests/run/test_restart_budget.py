"""The restart budget outlives the supervisor: its window is kept in the state file as wall-clock
times, and a new supervisor (a new monotonic clock) goes on with it. Waits before the first
READY=1 extend systemd's start timeout. Told on fake clocks; nothing sleeps."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.core.backoff import BackoffPolicy, RestartBudget
from supervisor.core.events import SignalEvent
from supervisor.errors import CrashLoop
from supervisor.run.events import extension_margin_s
from supervisor.run.restart import restart_times_wall, restore_budget
from supervisor.run.state import RunState
from tests.fakes import EPOCH_S, FakeClock
from tests.run.runner_support import LOAD_S, WARM_S, World, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


def _later_supervisor(tmp_path: Path, wall_s: float) -> World:
    """A new supervisor on the same state directory: its monotonic clock starts again at 0,
    the wall clock reads `wall_s`."""
    w = world(tmp_path)
    start = w.clock.now
    w.clock.wall = lambda: wall_s + (w.clock.now - start)  # type: ignore[method-assign]
    return w


def _crash_after_ready(w: World, after_s: float = 30.0) -> None:
    def start(server) -> None:
        w.on_start(server)
        w.events.call_at(w.clock.now + LOAD_S + WARM_S + after_s, lambda: server.crash_rank(1))

    w.launcher.on_start = start


def test_a_new_supervisor_goes_on_with_the_restart_budget_of_the_last_one(tmp_path: Path):
    first = world(tmp_path)
    _crash_after_ready(first)
    first.events.at(LOAD_S + WARM_S + 60.0, SIGTERM)
    assert runner(first, settings(tmp_path), watch_gpus=False).run() == 0
    state = first.store.load()
    crashed_at = EPOCH_S + LOAD_S + WARM_S + 30.0
    assert state.restart_count == 1
    assert state.restart_times == pytest.approx((crashed_at,), abs=1.0)

    # systemd starts the supervisor again 10 minutes later: one restart is left in the window.
    second = _later_supervisor(tmp_path, wall_s=crashed_at + 600.0)
    _crash_after_ready(second)
    with capture_logs() as logs, pytest.raises(CrashLoop) as err:
        runner(second, settings(tmp_path, max_restarts=1), watch_gpus=False).run()
    assert "crash loop: 1 restarts within 1800 s" in str(err.value)
    assert len(second.launcher.started) == 1
    restored = next(e for e in logs if e["event"] == "restart_budget_restored")
    assert (restored["restarts_in_window"], restored["max_restarts"]) == (1, 1)


def test_restarts_that_left_the_window_while_no_supervisor_ran_are_forgotten(tmp_path: Path):
    first = world(tmp_path)
    _crash_after_ready(first)
    first.events.at(LOAD_S + WARM_S + 60.0, SIGTERM)
    assert runner(first, settings(tmp_path), watch_gpus=False).run() == 0
    (crashed_at,) = first.store.load().restart_times

    later = _later_supervisor(tmp_path, wall_s=crashed_at + 1801.0)
    _crash_after_ready(later)
    later.events.at(LOAD_S + WARM_S + 60.0, SIGTERM)
    assert runner(later, settings(tmp_path, max_restarts=1), watch_gpus=False).run() == 0
    assert len(later.launcher.started) == 2  # restarted: the window was empty again
    assert later.store.load().restart_count == 2  # the count goes on; `reset-state` clears it


def test_times_round_trip_through_the_wall_clock_and_a_future_time_counts_as_now():
    policy = BackoffPolicy(restart_window_s=100.0, max_restarts=5)
    clock = FakeClock(start_s=50.0)
    budget = RestartBudget(policy, restart_times_s=(10.0, 45.0), total_restarts=7)
    stored = restart_times_wall(budget, clock)
    assert stored == (EPOCH_S + 10.0, EPOCH_S + 45.0)
    again = restore_budget(RunState(restart_times=stored, restart_count=7), policy, clock)
    assert again.restart_times_s == pytest.approx(budget.restart_times_s)
    assert again.total_restarts == 7
    # The wall clock was stepped back an hour since: the stored times lie in the future.
    stepped = FakeClock(start_s=5.0)
    stepped.wall = lambda: EPOCH_S - 3600.0  # type: ignore[method-assign]
    restored = restore_budget(RunState(restart_times=stored), policy, stepped)
    assert restored.restart_times_s == (5.0, 5.0)
    assert restored.restarts_in_window(5.0) == 2


def test_a_backoff_before_the_first_ready_extends_the_start_timeout(tmp_path: Path):
    w = world(tmp_path)
    starts = []

    def exit_once_while_loading(server) -> None:
        starts.append(server)
        w.on_start(server)
        if len(starts) == 1:
            w.events.call_at(w.clock.now + 2.0, lambda: server.exit_by_itself(1))

    w.launcher.on_start = exit_once_while_loading
    w.events.at(100.0, SIGTERM)
    run_settings = settings(tmp_path)
    assert runner(w, run_settings, watch_gpus=False).run() == 0
    margin_s = extension_margin_s(run_settings.config.gpu)
    # The backoff's first tick asks for its 10 s plus the margin.
    assert f"EXTEND_TIMEOUT_USEC={int((10.0 + margin_s) * 1e6)}" in w.notifier.messages
    assert len(w.launcher.started) == 2
