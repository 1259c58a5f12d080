"""The runner's event queue: signal handlers only queue, waits feed the watchdog and abort on a
stop signal while keeping component events for the loop."""

from __future__ import annotations

import os
import queue
import signal
from dataclasses import dataclass

import pytest

from supervisor.run_events import (
    EventClock,
    SignalEvent,
    StopRequested,
    install_signal_handlers,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class WatchdogLike:
    kind: str
    reason: str


def test_a_stop_signal_during_a_wait_raises_and_component_events_are_kept():
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    ticks = []
    clock = EventClock(FakeClock(), events, on_tick=lambda: ticks.append(1))
    event = WatchdogLike("memory_kill", "headroom 1 GB")
    events.put(event)
    events.put(SignalEvent(signal.SIGTERM))
    with pytest.raises(StopRequested) as stop:
        clock.sleep(30)
    assert stop.value.event.name == "SIGTERM"
    assert clock.held == [event]
    assert ticks  # systemd's watchdog was fed while waiting
    clock.give_back()
    assert events.get_nowait() is event
    assert clock.held == []


def test_a_wait_without_events_returns_at_its_deadline():
    fake = FakeClock()
    clock = EventClock(fake, queue.SimpleQueue())
    clock.sleep(0.0)
    clock.sleep(-1.0)
    assert fake.now == 0.0


def test_signal_handlers_only_queue_the_signal():
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        install_signal_handlers(events)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        got = [events.get(timeout=5), events.get(timeout=5)]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert got == [SignalEvent(signal.SIGINT), SignalEvent(signal.SIGTERM)]
