"""What travels on the runner's event queue, and why a server tree was killed: typed values.

A stop signal, a memory watchdog's action and a wake-up (a tree member exited, a probe answered)
are the only events; a kill carries a FailureKind, never a string, so the path from the kill to
the restart decision is checked by mypy end to end.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from supervisor.core.classify import FailureKind


class SignalAction(str, Enum):
    """What a signal asks of the supervisor (adapters/events.py maps each signal to one)."""

    STOP = "stop"  # SIGTERM, SIGINT, SIGQUIT: drain and stop
    RELOAD = "reload"  # SIGHUP: read the config file again (run/reload.py)
    STATUS = "status"  # SIGUSR1: the current status in the log


@dataclass(frozen=True, slots=True)
class SignalEvent:
    """A signal the supervisor received; `name` is the signal's name (SIGTERM)."""

    signum: int
    name: str
    action: SignalAction = SignalAction.STOP

    @property
    def stops(self) -> bool:
        return self.action is SignalAction.STOP


class MemoryAction(str, Enum):
    TERMINATED = "terminated"  # SIGTERM sent; the watchdog escalates to SIGKILL itself
    KILLED = "killed"  # the whole tree SIGKILLed


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchdogEvent:
    """Posted by the memory watchdog after it acted on the server tree."""

    action: MemoryAction
    failure: FailureKind
    reason: str
    at_s: float  # monotonic time of the signal
    pids: tuple[int, ...] = ()
    incident_path: str | None = None
    predicted: bool = False


class Wake(str, Enum):
    """Something the run loop should look at now rather than at its next tick."""

    TREE_CHANGED = "tree_changed"  # a process of the server tree exited
    PROBE_DONE = "probe_done"  # a health probe answered
    WORK_DONE = "work_done"  # work on another thread ended (a GPU reset): run/events.py


@dataclass(frozen=True, slots=True)
class WakeEvent:
    reason: Wake


Event = SignalEvent | WatchdogEvent | WakeEvent


@dataclass(frozen=True, slots=True)
class KillReason:
    """Why the tree is being stopped or killed; recorded once on the server, the first wins.

    `failure` None: a stop the operator asked for (SIGTERM to the supervisor).
    """

    failure: FailureKind | None
    detail: str = ""


STOP_REQUESTED = KillReason(None, "stop requested")
