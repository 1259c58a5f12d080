"""A dead server: kill what is left of its tree, reap it, and classify why it died.

The classification itself is core.classify's; this module gathers its inputs (exit status,
log tail, the kernel's OOM-kill counter, who killed the tree first) from the adapters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import structlog

from supervisor.adapters.procfs import ProcReader
from supervisor.adapters.server_process import ExitStatus, ServerProcess
from supervisor.core.classify import Classification, DeathContext, FailureKind, classify
from supervisor.core.sglang_args import LaunchPlan
from supervisor.errors import (
    GpuUnrecoverable,
    ServerArgsRejected,
    StartupFailed,
    SupervisorError,
)
from supervisor.monitor import Death
from supervisor.ports import Clock
from supervisor.state import StateStore

log = structlog.get_logger("supervisor.run")

# After SIGKILL the tree normally vanishes in milliseconds; ranks unpinning huge pools sit in D
# state for tens of seconds (sglang PR #32829) - the GPU release wait covers those.
TREE_GONE_WAIT_S = 10.0
# Kill reasons recorded by a component that override the classification (the watchdog).
_OVERRIDES = (FailureKind.MEMORY_KILL, FailureKind.GPU_DIRTY)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeathReport:
    """A classified death, handed to every death hook before the restart decision."""

    run_id: str
    classification: Classification
    exit_status: ExitStatus | None  # the main process's own exit, None if we killed it alive
    was_ready: bool
    pids: tuple[int, ...]  # the tree's processes that were killed
    plan: LaunchPlan  # the operator's argv, parsed
    argv: tuple[str, ...]  # as launched (override / auto-size applied)
    store: StateStore  # hooks may update the state file (e.g. a --hicache-size override)


# Called after every death, in order; e.g. "restart smaller" after a memory kill.
DeathHook = Callable[[DeathReport], None]


def terminal_error(kind: FailureKind, hint: str) -> SupervisorError | None:
    """The error that ends the run instead of a restart, or None to restart."""
    if kind is FailureKind.BAD_FLAGS:
        return ServerArgsRejected(hint)
    if kind is FailureKind.GPU_DIRTY:
        return GpuUnrecoverable(hint)
    if kind is FailureKind.STARTUP_TIMEOUT:
        # A load that progressed for the whole hard limit would take as long again.
        return StartupFailed(hint)
    return None


def component_death(server: ServerProcess, event: Any) -> Death | None:
    """Turn a component's event into a death, or None when the server lives on for now.

    `memory_terminate`: the watchdog sent SIGTERM and escalates itself; whatever exit follows is
    a memory kill. A FailureKind value (`memory_kill`): the component killed the tree.
    """
    kind = str(getattr(event, "kind", ""))
    reason = str(getattr(event, "reason", ""))
    log.warning("component_event", kind=kind, reason=reason)
    if kind == "memory_terminate":
        server.record_kill_reason(FailureKind.MEMORY_KILL.value, reason)
        return None
    if kind in {k.value for k in FailureKind}:
        server.record_kill_reason(kind, reason)
        return Death(FailureKind(kind), reason)
    return None


def wait_tree_gone(
    server: ServerProcess, clock: Clock, timeout_s: float = TREE_GONE_WAIT_S
) -> None:
    """Kill and reap until no live process of the tree is left, or log what stays."""
    deadline = clock.monotonic() + timeout_s
    while True:
        left = [p.pid for p in server.remaining() if not p.is_zombie]
        if not left:
            server.pump.join(1.0)
            return
        if clock.monotonic() >= deadline:
            log.error("server_tree_not_gone", pids=left, waited_s=timeout_s)
            return
        server.kill_all()
        clock.sleep(0.02)


def kill_and_classify(
    server: ServerProcess,
    death: Death,
    *,
    was_ready: bool,
    oom_kills_at_launch: int | None,
    proc: ProcReader,
    clock: Clock,
) -> tuple[Classification, ExitStatus | None, tuple[int, ...]]:
    """Kill the rest of the tree, wait for it, classify. Returns (class, the main process's own
    exit status if it exited before we killed, the PIDs killed)."""
    exited_first = server.poll()
    pids = server.kill_all(death.observed.value if death.observed else "exited", death.detail)
    wait_tree_gone(server, clock)
    reason = server.kill_reason
    override = None
    if reason is not None and reason.kind in {k.value for k in _OVERRIDES}:
        override = FailureKind(reason.kind)
    oom_now = proc.oom_kill_count()
    oom = None if oom_now is None or oom_kills_at_launch is None else oom_now - oom_kills_at_launch
    context = DeathContext(
        observed=death.observed,
        override=override,
        override_detail=reason.detail if override is not None and reason is not None else "",
        was_ready=was_ready,
        killed_by_us=exited_first is None,
        oom_kills=oom,
    )
    # A tree we killed alive died of our SIGKILL: its status says nothing about why.
    code = exited_first.exit_code if exited_first else None
    sig = exited_first.signal_number if exited_first else None
    result = classify(code, sig, server.tail(), context)
    log.error(
        "server_failed",
        failure=result.kind.value,
        hint=result.hint,
        exit_code=code,
        signal=sig,
        pids=list(pids),
    )
    return result, exited_first, pids
