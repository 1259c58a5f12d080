"""Restart smaller: after a memory kill of a server that uses the hierarchical cache, the next
launch gets `--hicache-size` × shrink_factor (core.shrink decides), kept in the state file so
it survives a restart of the supervisor or the machine until `reset-state` clears it.
"""

from __future__ import annotations

import dataclasses

import structlog

from supervisor.config import WatchdogConfig
from supervisor.core.classify import FailureKind
from supervisor.core.shrink import ShrinkDecision, decide_shrink
from supervisor.core.units import GB
from supervisor.run.death import DeathReport
from supervisor.run.state import RunState, StateStore

log = structlog.get_logger("supervisor.restart_smaller")


def restart_smaller(
    report: DeathReport, cfg: WatchdogConfig, store: StateStore
) -> ShrinkDecision | None:
    """After a memory kill: store the smaller size for the next launch and say what was decided.

    None when the death was not a memory kill. A ratio or auto-sized pool is converted to its
    size with the launch's pre-flight report (no second pre-flight).
    """
    if report.classification.kind is not FailureKind.MEMORY_KILL:
        return None
    decision = decide_shrink(
        report.plan,
        pool_bytes_per_rank=report.fit.host_pool_bytes_per_rank if report.fit else None,
        shrink_factor=cfg.shrink_factor,
        min_size_gb=max(1, cfg.min_hicache_size_bytes // GB),
    )
    if decision.size_gb is None:
        log.warning("hicache_not_shrunk", reason=decision.reason)
        return decision
    size = decision.size_gb

    def change(state: RunState) -> RunState:
        return dataclasses.replace(
            state,
            hicache_size_override_gb=size,
            override_reason=decision.reason,
            override_set_at=store.clock.wall(),  # [watchdog] shrink_expires counts from here
        )

    store.update(change)
    log.warning(
        "hicache_shrunk",
        previous_gb=decision.previous_gb,
        hicache_size_gb=size,
        reason=decision.reason,
        at_minimum=decision.at_minimum,
    )
    return decision
