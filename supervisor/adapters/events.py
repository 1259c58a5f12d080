"""The runner's event queue over queue.SimpleQueue, and signal handlers that only queue.

Handlers do nothing but `put` (reentrant-safe: gunicorn's arbiter does the same); the main loop
drains the queue. Any thread may post a watchdog event the same way. Every catchable signal a
supervisor meets has a defined meaning, which matters as a container's PID 1, where the kernel
applies no default action: TERM, INT and QUIT stop, HUP reloads the config, USR1 dumps the
status, USR2 and PIPE are ignored. `block_signals` holds them back from the start of the process
until the handlers exist, so a stop that comes during start-up is not lost.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Iterable
from types import FrameType
from typing import Any

from supervisor.core.events import Event, SignalAction, SignalEvent

SIGNAL_ACTIONS: dict[int, SignalAction] = {
    signal.SIGTERM: SignalAction.STOP,
    signal.SIGINT: SignalAction.STOP,
    signal.SIGQUIT: SignalAction.STOP,
    signal.SIGHUP: SignalAction.RELOAD,
    signal.SIGUSR1: SignalAction.STATUS,
}
IGNORED_SIGNALS = (signal.SIGUSR2, signal.SIGPIPE)
# Held back from the process's start until the handlers are installed (and never passed on:
# they are unblocked before the first child is started, which inherits the mask).
HELD_SIGNALS = frozenset({*SIGNAL_ACTIONS, *IGNORED_SIGNALS})


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
    action = SIGNAL_ACTIONS.get(signum, SignalAction.STOP)
    return SignalEvent(signum, signal.Signals(signum).name, action)


def block_signals() -> None:
    """Hold the supervisor's signals pending (from the first line of `run`)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)


def unblock_signals() -> None:
    """Deliver what was held to the handlers now installed."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)


def install_signal_handlers(
    events: QueueEvents, signals: Iterable[int] = tuple(SIGNAL_ACTIONS)
) -> dict[int, Any]:
    """Queue a SignalEvent for each of `signals`, ignore USR2 and PIPE; returns the previous
    handlers (to restore)."""
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: FrameType | None) -> None:
        events.put(signal_event(signum))

    for sig in signals:
        previous[sig] = signal.signal(sig, handler)
    for sig in IGNORED_SIGNALS:
        # A handler that does nothing, not SIG_IGN: an ignored signal stays ignored across
        # exec, and the server must start with SGLang's own dispositions.
        previous[sig] = signal.signal(sig, _ignore)
    return previous


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    return None


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
