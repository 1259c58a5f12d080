"""The runner's event queue: signals and component events (the watchdog), and a clock for
blocking waits that keeps systemd's watchdog fed and aborts when a stop signal arrives.

Signal handlers only `put_nowait` onto a queue.SimpleQueue (reentrant-safe, gunicorn 26.x
style); the main loop drains it. Any thread may post a component event the same way.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from supervisor.core.sglang_args import LaunchPlan
from supervisor.ports import Clock

if TYPE_CHECKING:
    from supervisor.adapters.server_process import ServerProcess

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_MAX_SLICE_S = 1.0


@dataclass(frozen=True, slots=True)
class SignalEvent:
    signum: int

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class ComponentEvent(Protocol):
    """What a component (the memory watchdog's WatchdogEvent) posts: `kind` is a FailureKind
    value ("memory_kill") or "memory_terminate"; `reason` is one line for logs and state."""

    @property
    def kind(self) -> str: ...

    @property
    def reason(self) -> str: ...


Event = Any  # SignalEvent | ComponentEvent: the queue carries both
EventQueue = queue.SimpleQueue  # alias for annotations: EventQueue[Event]


class Component(Protocol):
    """Something started beside a launched server (the memory watchdog); stopped before the
    next launch. It may kill the tree itself (server.kill_all) and post an event."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = ...) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchInfo:
    """What a component factory gets to know about a launch."""

    run_id: str
    argv: tuple[str, ...]  # launch_server's argv as launched (override/auto-size applied)
    plan: LaunchPlan  # parsed from that argv
    expected_total_bytes: int | None  # the pre-flight's host total for the tree, when it ran
    state_dir: str


# (server, post, info) -> component or None; `post` puts an event on the runner's queue and is
# safe from any thread.
ComponentFactory = Callable[
    ["ServerProcess", Callable[[Any], None], LaunchInfo], "Component | None"
]


class StopRequested(Exception):
    """A stop signal arrived during a blocking wait (leftover cleanup, GPU release)."""

    def __init__(self, event: SignalEvent) -> None:
        super().__init__(event.name)
        self.event = event


def install_signal_handlers(events: queue.SimpleQueue[Event]) -> None:
    """SIGTERM and SIGINT become SignalEvents on the queue; nothing else happens in the handler."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        events.put_nowait(SignalEvent(signum))

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


class EventClock:
    """A Clock for waits that block the main loop: each sleep feeds systemd's watchdog and
    raises StopRequested when a stop signal is queued; other events are kept for the loop."""

    def __init__(
        self,
        clock: Clock,
        events: queue.SimpleQueue[Event],
        on_tick: Callable[[], None] = lambda: None,
    ) -> None:
        self._clock = clock
        self._events = events
        self._on_tick = on_tick
        self.held: list[Event] = []

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def sleep(self, seconds: float) -> None:
        deadline = self._clock.monotonic() + max(0.0, seconds)
        while True:
            self._on_tick()
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return
            try:
                # Wake at least every second: a 300 s backoff must still feed WatchdogSec=60.
                event = self._events.get(timeout=min(left, _MAX_SLICE_S))
            except queue.Empty:
                continue
            if isinstance(event, SignalEvent):
                raise StopRequested(event)
            self.held.append(event)

    def give_back(self) -> None:
        """Put held component events back on the queue for the main loop."""
        for event in self.held:
            self._events.put_nowait(event)
        self.held.clear()
