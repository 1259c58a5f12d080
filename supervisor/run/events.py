"""A clock for the run loop's blocking waits (leftover cleanup, GPU release, backoff): each wait
keeps systemd's watchdog fed, ends early with StopRequested when a stop signal is queued, and
answers the other signals (HUP, USR1) without ending.

The queue itself is core.ports.EventQueue (adapters/events.py in production).
"""

from __future__ import annotations

from collections.abc import Callable

from supervisor.core.events import Event, SignalEvent, WakeEvent
from supervisor.core.ports import Clock, EventQueue

# Wake at least this often: a 300 s backoff must still feed WatchdogSec=60.
_MAX_SLICE_S = 1.0


class StopRequested(Exception):
    """A stop signal arrived during a blocking wait (leftover cleanup, GPU release, backoff)."""

    def __init__(self, event: SignalEvent) -> None:
        super().__init__(event.name)
        self.event = event


class EventClock:
    """A Clock whose sleeps drain the event queue: a stop signal raises StopRequested, other
    events are kept in `held` (a dead server's watchdog events are dropped by the caller)."""

    def __init__(
        self,
        clock: Clock,
        events: EventQueue,
        on_tick: Callable[[], None] = lambda: None,
        on_signal: Callable[[SignalEvent], None] = lambda _event: None,
    ) -> None:
        self._clock = clock
        self._events = events
        self._on_tick = on_tick
        self._on_signal = on_signal
        self.held: list[Event] = []

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def wall(self) -> float:
        return self._clock.wall()

    def poll(self) -> None:
        """Act on the events queued already, without waiting (a stop raises StopRequested)."""
        while (event := self._events.get(0.0)) is not None:
            self._take(event)

    def sleep(self, seconds: float) -> None:
        deadline = self._clock.monotonic() + max(0.0, seconds)
        while True:
            self._on_tick()
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return
            event = self._events.get(min(left, _MAX_SLICE_S))
            if event is not None:
                self._take(event)

    def _take(self, event: Event) -> None:
        if isinstance(event, SignalEvent):
            if event.stops:
                raise StopRequested(event)
            self._on_signal(event)  # HUP, USR1: answered, the wait goes on
        elif not isinstance(event, WakeEvent):  # no server to look at
            self.held.append(event)
