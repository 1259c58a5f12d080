"""The runner's event queue over queue.SimpleQueue, and signal handlers that only queue.

Handlers do nothing but `put` (reentrant-safe: gunicorn's arbiter does the same); the main loop
drains the queue. Any thread may post a watchdog event the same way.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Iterable
from types import FrameType
from typing import Any

from supervisor.core.events import Event, SignalEvent

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class QueueEvents:
    """Implements core.ports.EventQueue with a SimpleQueue (blocking get with a timeout)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def put(self, event: Event) -> None:
        self._queue.put_nowait(event)

    def get(self, timeout_s: float) -> Event | None:
        try:
            return self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None


def signal_event(signum: int) -> SignalEvent:
    return SignalEvent(signum, signal.Signals(signum).name)


def install_signal_handlers(
    events: QueueEvents, signals: Iterable[int] = STOP_SIGNALS
) -> dict[int, Any]:
    """Queue a SignalEvent for each of `signals`; returns the previous handlers (to restore)."""
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: FrameType | None) -> None:
        events.put(signal_event(signum))

    for sig in signals:
        previous[sig] = signal.signal(sig, handler)
    return previous


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
