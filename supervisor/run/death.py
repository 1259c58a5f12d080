"""A dead server: kill what is left of its tree, reap it, and classify why it died.

The classification itself is core.classify's; this module gathers its inputs (exit status,
log tail, the kernel's OOM-kill counters of the host and of the tree's cgroup, why the tree was
killed first) from the adapters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import structlog

from supervisor.core.checks import FitReport
from supervisor.core.classify import (
    Classification,
    DeathContext,
    FailureKind,
    classify,
    killed_itself,
)
from supervisor.core.drain import Remaining
from supervisor.core.events import STOP_REQUESTED, KillReason, SignalEvent
from supervisor.core.log_phases import marks_in
from supervisor.core.ports import Clock, EventQueue, LaunchedServer, Processes
from supervisor.core.readings import ExitStatus
from supervisor.core.sglang_args import LaunchPlan

log = structlog.get_logger("supervisor.run")

# After SIGKILL the tree normally vanishes in milliseconds; ranks unpinning huge pools sit in D
# state for tens of seconds (sgl-project/sglang PR #32829) - the GPU release wait covers those.
TREE_GONE_WAIT_S = 10.0
# Why a component killed the tree wins over what the exit status suggests.
_OVERRIDES = frozenset(
    {
        FailureKind.MEMORY_KILL,
        FailureKind.GPU_DIRTY,
        FailureKind.GPU_XID,
        FailureKind.GPU_XID_FATAL,
        FailureKind.PEER_LOST,
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class Death:
    """The server is dead: `observed` is what the supervisor saw (None: it exited by itself)."""

    observed: FailureKind | None
    detail: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeathReport:
    """A classified death, handed to every death hook before the restart decision."""

    run_id: str
    classification: Classification
    exit_status: ExitStatus | None  # the main process's own exit, None if we killed it alive
    was_ready: bool
    pids: tuple[int, ...]  # the tree's processes that were killed
    argv: tuple[str, ...]  # as launched (override / auto-size applied)
    plan: LaunchPlan  # how SGLang read that argv (its --config YAML merged in)
    fit: FitReport | None  # the pre-flight's report for that argv (None: it did not run)


# Called after every death, in order; e.g. "restart smaller" after a memory kill.
DeathHook = Callable[[DeathReport], None]


@dataclasses.dataclass(frozen=True, slots=True)
class OomCounts:
    """The kernel's OOM-kill counters at one moment; None where unreadable."""

    host: int | None  # /proc/vmstat oom_kill
    tree: int | None  # the tree cgroup's oom_kill (memory.events)


def oom_counts(server: LaunchedServer, processes: Processes) -> OomCounts:
    return OomCounts(host=processes.oom_kill_count(), tree=server.oom_kill_count())


def _grown(now: int | None, then: int | None) -> int | None:
    return None if now is None or then is None else now - then


def wait_tree_gone(
    server: LaunchedServer, clock: Clock, reason: KillReason, timeout_s: float = TREE_GONE_WAIT_S
) -> None:
    """Kill and reap until no live process of the tree is left, or log what stays."""
    deadline = clock.monotonic() + timeout_s
    while True:
        left = [p.pid for p in server.remaining() if not p.is_zombie]
        if not left:
            server.drain_output(1.0)
            return
        if clock.monotonic() >= deadline:
            log.error("server_tree_not_gone", pids=left, waited_s=timeout_s)
            return
        server.kill_all(reason)
        clock.sleep(0.02)


def kill_and_classify(
    server: LaunchedServer,
    death: Death,
    *,
    was_ready: bool,
    oom_at_launch: OomCounts,
    processes: Processes,
    clock: Clock,
) -> tuple[Classification, ExitStatus | None, tuple[int, ...]]:
    """Kill the rest of the tree, wait for it, classify. Returns (class, the main process's own
    exit status if it exited before we killed, the PIDs killed)."""
    exited_first = server.poll()
    reason = KillReason(death.observed, death.detail)
    pids = server.kill_all(reason)
    wait_tree_gone(server, clock, reason)
    first = server.kill_reason
    override = first.failure if first is not None and first.failure in _OVERRIDES else None
    oom_now = oom_counts(server, processes)
    context = DeathContext(
        observed=death.observed,
        override=override,
        override_detail=first.detail if override is not None and first is not None else "",
        was_ready=was_ready,
        killed_by_us=exited_first is None,
        oom_kills=_grown(oom_now.host, oom_at_launch.host),
        tree_oom_kills=_grown(oom_now.tree, oom_at_launch.tree),
    )
    # A tree we killed alive died of our SIGKILL: its status says nothing about why.
    code = exited_first.exit_code if exited_first else None
    sig = exited_first.signal_number if exited_first else None
    tail = server.tail()
    result = classify(code, sig, tail, context)
    log.error(
        "server_failed",
        failure=result.kind.value,
        hint=result.hint,
        exit_code=code,
        signal=sig,
        pids=list(pids),
        sglang_self_kill=not context.killed_by_us and killed_itself(sig, marks_in(tail)),
        oom_kills=context.oom_kills,
        tree_oom_kills=context.tree_oom_kills,
    )
    return result, exited_first, pids


_STOP_POLL_S = 0.1


@dataclasses.dataclass(frozen=True, slots=True)
class Drained:
    """How a stop's drain ended: `drained_s` from the SIGTERM until the main process exited or
    the drain was cut; `cut` "grace" (the grace ran out with it alive), "signal" (a second stop
    signal), None (it exited by itself). `remaining`: SGLang's last count of the requests in
    flight as read when the drain ended, before the SIGKILL (a line read later is not this
    drain's: it could not have been printed at the cut)."""

    pids: tuple[int, ...]  # the tree's processes signalled at the end
    started_s: float  # monotonic, the SIGTERM
    drained_s: float
    cut: str | None
    remaining: Remaining | None = None


def drain_then_kill(
    server: LaunchedServer,
    grace_s: float,
    clock: Clock,
    events: EventQueue,
    feed_watchdog: Callable[[], None],
    counted: Callable[[float], Remaining | None] = lambda _started_s: None,
) -> Drained:
    """SIGTERM the main process, give it `grace_s` to drain and exit (a second stop signal cuts
    it short), then SIGKILL the whole tree and wait until it is gone. `counted(started_s)`:
    SGLang's last count of requests in flight since the SIGTERM, read at the end of the drain."""
    server.terminate(STOP_REQUESTED)
    started_s = clock.monotonic()
    deadline = started_s + grace_s
    cut: str | None = None
    while server.poll() is None:
        left = deadline - clock.monotonic()
        if left <= 0:
            cut = "grace"
            break
        event = events.get(min(_STOP_POLL_S, left))
        if isinstance(event, SignalEvent) and event.stops:
            log.warning("stop_escalated", signal=event.name)
            events.put(event)  # still a stop for the next wait (a reload's relaunch has one)
            cut = "signal"
            break
        feed_watchdog()
    drained_s = clock.monotonic() - started_s
    remaining = counted(started_s)
    pids = server.kill_all(STOP_REQUESTED)
    wait_tree_gone(server, clock, STOP_REQUESTED)
    return Drained(pids, started_s, drained_s, cut, remaining)


def note_cut(drained: Drained, grace_s: float) -> None:
    """`drain_cut`: the grace ran out with the server alive, and its SIGKILL reset the requests
    still in flight: SGLang's last count of them (None: it printed none during this drain)."""
    remaining = drained.remaining
    log.warning(
        "drain_cut",
        grace_s=grace_s,
        drained_s=round(drained.drained_s, 3),
        remaining_requests=remaining.requests if remaining is not None else None,
        counted_after_s=round(remaining.at_s - drained.started_s, 3) if remaining else None,
    )
