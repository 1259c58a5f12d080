"""The runner's event queue and waits: signal handlers only queue, waits feed systemd's
watchdog, extend its start timeout, and end early on a stop signal while keeping watchdog
events for the loop."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.events import (
    QueueEvents,
    install_signal_handlers,
    restore_signal_handlers,
    signal_event,
)
from supervisor.config import GpuConfig
from supervisor.core.classify import FailureKind
from supervisor.core.events import MemoryAction, SignalEvent, WatchdogEvent
from supervisor.run.events import (
    EXTEND_SLACK_S,
    MAX_SLICE_S,
    EventClock,
    StopRequested,
    extension_margin_s,
    watchdog_slice_s,
)
from tests.fakes import FakeClock, FakeEvents

KILL = WatchdogEvent(
    action=MemoryAction.KILLED, failure=FailureKind.MEMORY_KILL, reason="headroom 1 GB", at_s=0.0
)


def test_a_stop_signal_during_a_wait_raises_and_watchdog_events_are_kept():
    clock = FakeClock()
    events = FakeEvents(clock)
    ticks = []
    waiting = EventClock(clock, events, on_tick=lambda: ticks.append(1))
    events.at(1005.0, KILL)
    events.at(1010.0, SignalEvent(signal.SIGTERM, "SIGTERM"))
    with pytest.raises(StopRequested) as stop:
        waiting.sleep(30)
    assert stop.value.event.name == "SIGTERM"
    assert clock.now == 1010.0
    assert waiting.held == [KILL]
    assert len(ticks) >= 10  # systemd's watchdog fed at least every second while waiting


def test_a_wait_without_events_returns_at_its_deadline():
    clock = FakeClock()
    waiting = EventClock(clock, FakeEvents(clock))
    waiting.sleep(0.0)
    waiting.sleep(-1.0)
    assert clock.now == 1000.0
    waiting.sleep(2.5)
    assert clock.now == 1002.5


def test_the_real_queue_returns_none_when_nothing_came():
    events = QueueEvents()
    assert events.get(0.0) is None
    events.put(KILL)
    assert events.get(0.0) is KILL


def test_signal_handlers_only_queue_the_signal():
    events = QueueEvents()
    previous = install_signal_handlers(events)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        got = [events.get(5.0), events.get(5.0)]
    finally:
        restore_signal_handlers(previous)
    assert got == [signal_event(signal.SIGINT), signal_event(signal.SIGTERM)]
    assert signal.getsignal(signal.SIGTERM) == previous[signal.SIGTERM]


def test_every_tick_of_a_wait_extends_the_start_timeout_past_the_rest_of_the_wait():
    clock = FakeClock()
    asked: list[tuple[float, float]] = []  # (when, how long)
    waiting = EventClock(
        clock,
        FakeEvents(clock),
        extend=lambda seconds: asked.append((clock.now, seconds)),
        extend_margin_s=150.0,
    )
    waiting.sleep(300.0)  # a backoff at its cap
    assert len(asked) >= 300  # at least once a second (the notifier sends once a second)
    assert asked[0] == (1000.0, 450.0)
    assert asked[-1] == (1300.0, 150.0)
    # Each extension reaches at least `margin` past the wait's end: a tick that is late by less
    # than the margin still finds systemd waiting.
    assert all(when + seconds >= 1300.0 + 150.0 for when, seconds in asked)


def test_the_margin_covers_an_nvml_query_between_two_ticks_not_a_reset_that_runs_off_the_loop():
    gpu = GpuConfig(reset_timeout_s=120.0, nvml_timeout_s=5.0)
    assert extension_margin_s(gpu) == 5.0 + EXTEND_SLACK_S


def test_wait_for_returns_once_done_and_a_wake_from_another_thread_is_seen_at_once():
    """The slice is an hour: only the wake can end the tick's wait before the test's bound."""
    events = QueueEvents()
    ticks: list[str] = []
    waiting = EventClock(
        SystemClock(), events, on_tick=lambda: ticks.append("tick"), max_slice_s=3600.0
    )
    finished = threading.Event()

    def work() -> None:
        finished.set()
        waiting.wake()

    worker = threading.Thread(target=work)
    worker.start()
    assert waiting.wait_for(finished.is_set, timeout_s=600.0)
    worker.join()
    assert ticks  # the watchdog was fed while it waited
    assert waiting.held == []  # the wake is no event for the loop to keep
    assert not waiting.wait_for(lambda: False, timeout_s=0.0)  # the timeout: False


def test_the_slice_keeps_watchdog_ticks_within_a_quarter_of_watchdogsec():
    assert watchdog_slice_s(None) == MAX_SLICE_S
    assert watchdog_slice_s(30.0) == MAX_SLICE_S  # WatchdogSec=60: a tick every second
    assert watchdog_slice_s(0.2) == 0.1  # WatchdogSec=0.4 s
