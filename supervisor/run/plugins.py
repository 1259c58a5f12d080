"""What the run loop is built from: the outside world it reaches (RunnerIO) and what plugs into
it (Plugins: the memory watchdog's component factory and hooks), with the types they share.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from supervisor.config import RunSettings
from supervisor.core.checks import FitReport
from supervisor.core.events import Event
from supervisor.core.lifecycle import HealthStatus
from supervisor.core.listener import PortCheck
from supervisor.core.ports import (
    Clock,
    EventQueue,
    GpuResetter,
    GpuSensor,
    Notifier,
    Processes,
    Reservations,
    ServerHandle,
    ServerLauncher,
)
from supervisor.core.sglang_args import LaunchPlan
from supervisor.group.handshake import GroupHandshake
from supervisor.run.death import DeathHook
from supervisor.run.gpu_wait import GpuRelease, ReleaseResult


class Component(Protocol):
    """Something started beside a launched server (the memory watchdog); stopped before the
    next launch. It may kill the tree itself (kill_all) and post a WatchdogEvent."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = ...) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LaunchInfo:
    """What a component factory gets to know about a launch."""

    run_id: str
    argv: tuple[str, ...]  # launch_server's argv as launched (override/auto-size applied)
    plan: LaunchPlan  # parsed from that argv
    fit: FitReport | None  # the pre-flight's report for that argv (None: it did not run)


# (server, post, info) -> component or None; `post` is safe from any thread.
ComponentFactory = Callable[[ServerHandle, Callable[[Event], None], LaunchInfo], Component | None]
# Told the outcome of every GPU release wait (ok or not) before a failed one ends the run.
ReleaseHook = Callable[[ReleaseResult], None]
# Told the settings a reload (SIGHUP) put in force, to apply what they read at once.
ReloadHook = Callable[[RunSettings], None]
# Before the GPU release wait of a relaunch, with the dead tree's PIDs: the GPU event watch
# waits there itself, resetting the GPUs a driver event asked a reset for; may raise
# SupervisorError to end the run instead.
RelaunchHook = Callable[[GpuRelease, Sequence[int], Clock], None]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunnerIO:
    """The outside world as the runner reaches it (adapters in production, fakes in tests)."""

    clock: Clock
    events: EventQueue
    launcher: ServerLauncher
    processes: Processes
    notifier: Notifier
    probe_factory: Callable[[LaunchPlan], Callable[[], HealthStatus]]
    sensor: GpuSensor | None = None  # None: the GPUs are not watched (backend none)
    resetter: GpuResetter | None = None
    probe_executor: Callable[[], concurrent.futures.Executor] | None = None
    reservations: Reservations | None = None  # the host-wide ledger; None: not kept
    # Removes the /dev/shm segments a gone tree left (its members seen: pid -> start ticks).
    sweep_shm: Callable[[Mapping[int, int]], object] = lambda _seen: None
    # The settings read again from the config file (SIGHUP); raises SupervisorError on a bad
    # one. None: nothing to re-read (no --config).
    reload_settings: Callable[[], RunSettings] | None = None
    # Group mode: this node's part in the group's launch decision (None: one box).
    group: GroupHandshake | None = None
    # (main pid, tree pids, host, port) -> who holds the port SGLang should listen on, asked
    # when a probe first answers 200 (adapters/listeners.py check_port); None: not checked.
    port_check: Callable[[int, Sequence[int], str, int], PortCheck] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plugins:
    """What plugs into the loop: the memory watchdog's and the GPU event watch's factories and
    hooks."""

    components: Sequence[ComponentFactory] = ()
    death_hooks: Sequence[DeathHook] = ()
    release_hooks: Sequence[ReleaseHook] = ()
    reload_hooks: Sequence[ReloadHook] = ()
    relaunch_hooks: Sequence[RelaunchHook] = ()

    def before_relaunch(self, release: GpuRelease, pids: Sequence[int], clock: Clock) -> None:
        for hook in self.relaunch_hooks:
            hook(release, pids, clock)
