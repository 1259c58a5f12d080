"""A clock for the run loop's blocking waits (leftover cleanup, GPU release and its resets,
backoff): each wait keeps systemd's watchdog fed, extends its start timeout while the unit is
starting, ends early with StopRequested when a stop signal is queued, and answers the other
signals (HUP, USR1) without ending. Work done on other threads (the GPU resets) is waited for
with `wait_for`, which they end early with `wake`.

The queue itself is core.ports.EventQueue (adapters/events.py in production).
"""

from __future__ import annotations

from collections.abc import Callable

from supervisor.config import GpuConfig
from supervisor.core.events import Event, SignalEvent, Wake, WakeEvent
from supervisor.core.ports import Clock, EventQueue

# Wake at least this often: a 300 s backoff must still feed WatchdogSec=60.
MAX_SLICE_S = 1.0
# An extension covers the rest of the wait plus the longest step between two ticks that is not
# a wait (an NVML query, bounded by its own timeout) plus this. GPU resets are no such step:
# they run on other threads while the loop ticks (run/gpu_repair.py).
EXTEND_SLACK_S = 30.0


def extension_margin_s(gpu: GpuConfig) -> float:
    """How far past a wait's end EXTEND_TIMEOUT_USEC reaches: the blocking steps between two
    ticks (an NVML query) must fit before systemd's start timeout ends."""
    return gpu.nvml_timeout_s + EXTEND_SLACK_S


def watchdog_slice_s(watchdog_interval_s: float | None) -> float:
    """The longest a wait goes without a tick: a second, or a quarter of WatchdogSec (half the
    notifier's interval) when that is shorter, so WATCHDOG=1 is never late (runner.py)."""
    if watchdog_interval_s is None:
        return MAX_SLICE_S
    return min(MAX_SLICE_S, watchdog_interval_s / 2)


class StopRequested(Exception):
    """A stop signal arrived during a blocking wait (leftover cleanup, GPU release, backoff)."""

    def __init__(self, event: SignalEvent) -> None:
        super().__init__(event.name)
        self.event = event


class EventClock:
    """A Clock whose sleeps drain the event queue: a stop signal raises StopRequested, other
    events are kept in `held` (a dead server's watchdog events are dropped by the caller).

    `extend(seconds)` is called at every tick of a wait with the time it still needs: systemd's
    EXTEND_TIMEOUT_USEC (the notifier sends it only while the unit is starting, at most once a
    second), so cleanup, GPU release and backoff before the first READY=1 never outlast
    TimeoutStartSec.
    """

    def __init__(
        self,
        clock: Clock,
        events: EventQueue,
        on_tick: Callable[[], None] = lambda: None,
        on_signal: Callable[[SignalEvent], object] = lambda _event: None,
        *,
        extend: Callable[[float], object] = lambda _seconds: None,
        extend_margin_s: float = EXTEND_SLACK_S,
        max_slice_s: float = MAX_SLICE_S,
    ) -> None:
        self._clock = clock
        self._events = events
        self._on_tick = on_tick
        self._on_signal = on_signal
        self._extend = extend
        self._extend_margin_s = extend_margin_s
        self._max_slice_s = max_slice_s  # the longest the loop goes without a tick
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
        self.wait_for(lambda: False, seconds)

    def wait_for(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Tick until `done()` (True) or the timeout (False). `done` is asked at every tick:
        at least every `max_slice_s`, and after every event, so a worker thread that calls
        `wake` when its work ends is seen at once."""
        deadline = self._clock.monotonic() + max(0.0, timeout_s)
        while True:
            self._on_tick()
            if done():
                return True
            left = deadline - self._clock.monotonic()
            self._extend(max(0.0, left) + self._extend_margin_s)
            if left <= 0:
                return False
            event = self._events.get(min(left, self._max_slice_s))
            if event is not None:
                self._take(event)

    def wake(self) -> None:
        """From any thread: end the current tick's wait now (`wait_for` asks `done` again)."""
        self._events.put(WakeEvent(Wake.WORK_DONE))

    def _take(self, event: Event) -> None:
        if isinstance(event, SignalEvent):
            if event.stops:
                raise StopRequested(event)
            self._on_signal(event)  # HUP, USR1: answered, the wait goes on
        elif not isinstance(event, WakeEvent):  # no server to look at
            self.held.append(event)
