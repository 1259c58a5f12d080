"""Restart smaller: after a memory kill of a server that uses the hierarchical cache, the next
launch gets `--hicache-size` × shrink_factor (core.shrink decides), kept in the state file so
it survives a restart of the supervisor or the machine until `reset-state` clears it.

The size is written twice. The watchdog writes it before it signals the tree (ShrinkKeeper), so
a supervisor killed between its kill and the death's classification (by systemd's watchdog, an
operator, the kernel's OOM killer on a host short of memory) still relaunches smaller. The
classification writes it again (`restart_smaller`): the same decision from the same launch, so
it confirms the first, and it is the one that logs `hicache_shrunk`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import structlog

from supervisor.config import WatchdogConfig
from supervisor.core.checks import FitReport
from supervisor.core.classify import FailureKind
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.shrink import ShrinkDecision, decide_shrink
from supervisor.core.units import GB
from supervisor.run.death import DeathReport
from supervisor.run.state import RunState, StateStore

log = structlog.get_logger("supervisor.restart_smaller")

# Before a SIGKILL the watchdog does not wait for the state file's lock: when the run loop is
# writing the file just then, the kill goes first and the size is written right after it.
URGENT_LOCK_WAIT_S = 0.0


def shrink_for(plan: LaunchPlan, fit: FitReport | None, cfg: WatchdogConfig) -> ShrinkDecision:
    """The size after a memory kill of the launch `plan` (its argv as launched): pure."""
    return decide_shrink(
        plan,
        pool_bytes_per_rank=fit.host_pool_bytes_per_rank if fit else None,
        shrink_factor=cfg.shrink_factor,
        min_size_gb=max(1, cfg.min_hicache_size_bytes // GB),
    )


def _setter(size_gb: int, reason: str, store: StateStore) -> Callable[[RunState], RunState]:
    def change(state: RunState) -> RunState:
        return dataclasses.replace(
            state,
            hicache_size_override_gb=size_gb,
            override_reason=reason,
            override_set_at=store.clock.wall(),  # [watchdog] shrink_expires counts from here
        )

    return change


def restart_smaller(
    report: DeathReport, cfg: WatchdogConfig, store: StateStore
) -> ShrinkDecision | None:
    """After a memory kill: store the smaller size for the next launch and say what was decided.

    None when the death was not a memory kill. A ratio or auto-sized pool is converted to its
    size with the launch's pre-flight report (no second pre-flight).
    """
    if report.classification.kind is not FailureKind.MEMORY_KILL:
        return None
    decision = shrink_for(report.plan, report.fit, cfg)
    if decision.size_gb is None:
        log.warning("hicache_not_shrunk", reason=decision.reason)
        return decision
    store.update(_setter(decision.size_gb, decision.reason, store))
    log.warning(
        "hicache_shrunk",
        previous_gb=decision.previous_gb,
        hicache_size_gb=decision.size_gb,
        reason=decision.reason,
        at_minimum=decision.at_minimum,
    )
    return decision


class ShrinkKeeper:
    """The watchdog's half: called before the tree is signalled, writes the size the coming
    memory kill will bring (nothing for a server without the hierarchical cache).

    `urgent` (before a SIGKILL): neither the disk nor the store's lock is waited for (a kill
    must not wait on either), and nothing is logged (a log write may block). The watchdog calls
    again once the tree is signalled; that call (and a call before a SIGTERM, which has its
    grace anyway) writes durably and logs `hicache_shrink_saved`, once per launch.
    """

    def __init__(
        self,
        plan: LaunchPlan,
        fit: FitReport | None,
        cfg: Callable[[], WatchdogConfig],
        store: StateStore,
    ) -> None:
        self.plan = plan
        self.fit = fit
        self.cfg = cfg  # read at the kill: a reload's shrink_factor applies
        self.store = store
        self.saved = False  # durably

    def __call__(self, urgent: bool) -> None:
        if self.saved:
            return
        decision = shrink_for(self.plan, self.fit, self.cfg())
        if decision.size_gb is None:
            self.saved = True  # nothing to keep; the classification says why
            return
        change = _setter(decision.size_gb, decision.reason, self.store)
        if urgent:
            self.store.try_update(change, wait_s=URGENT_LOCK_WAIT_S, sync=False)
            return
        self.store.update(change)
        self.saved = True
        log.warning(
            "hicache_shrink_saved",
            previous_gb=decision.previous_gb,
            hicache_size_gb=decision.size_gb,
            reason=decision.reason,
            detail="written before the kill: a supervisor restarted now relaunches smaller",
        )
