"""A clock that advances only when slept on, and an event queue on it."""

from __future__ import annotations

from collections.abc import Callable

from supervisor.core.events import Event

EPOCH_S = 1_800_000_000.0  # wall time of FakeClock's zero


class FakeClock:
    """Monotonic time that only moves when someone sleeps (or a test advances it)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)

    def wall(self) -> float:
        return EPOCH_S + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeEvents:
    """An event queue on a FakeClock: `get` jumps the clock to the next scheduled event within
    the timeout (or to the timeout), and runs the clock's alarms on the way."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._queue: list[tuple[float, int, Event]] = []
        self._alarms: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def put(self, event: Event) -> None:
        self.at(self.clock.now, event)

    def at(self, when_s: float, event: Event) -> None:
        """Deliver `event` once the clock reaches `when_s`."""
        self._seq += 1
        self._queue.append((when_s, self._seq, event))
        self._queue.sort(key=lambda e: (e[0], e[1]))

    def call_at(self, when_s: float, action: Callable[[], None]) -> None:
        """Run `action` once the clock reaches `when_s` (a rank dies, a probe changes ...)."""
        self._seq += 1
        self._alarms.append((when_s, self._seq, action))
        self._alarms.sort(key=lambda a: (a[0], a[1]))

    def get(self, timeout_s: float) -> Event | None:
        deadline = self.clock.now + max(0.0, timeout_s)
        while True:
            next_alarm = self._alarms[0][0] if self._alarms else float("inf")
            next_event = self._queue[0][0] if self._queue else float("inf")
            if next_alarm <= min(next_event, deadline):
                when, _seq, action = self._alarms.pop(0)
                self.clock.now = max(self.clock.now, when)
                action()
                continue
            if next_event <= deadline:
                when, _seq, event = self._queue.pop(0)
                self.clock.now = max(self.clock.now, when)
                return event
            self.clock.now = deadline
            return None
