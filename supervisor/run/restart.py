"""After a death: file it in the state file, then relaunch after a delay or end the run with
the error (and exit code) its kind calls for."""

from __future__ import annotations

import dataclasses

import structlog

from supervisor.core.backoff import RestartBudget, RestartDecision, RunEnd, decide_after_failure
from supervisor.core.ports import Clock
from supervisor.errors import (
    ConfigError,
    CrashLoop,
    GpuUnrecoverable,
    ServerArgsRejected,
    StartupFailed,
    SupervisorError,
)
from supervisor.run.death import DeathReport
from supervisor.run.state import StateStore

log = structlog.get_logger("supervisor.run")

_END_ERRORS: dict[RunEnd, type[SupervisorError]] = {
    RunEnd.ARGS_REJECTED: ServerArgsRejected,
    RunEnd.GPU_UNRECOVERABLE: GpuUnrecoverable,
    RunEnd.STARTUP_FAILED: StartupFailed,
    RunEnd.CRASH_LOOP: CrashLoop,
    RunEnd.BAD_CONFIG: ConfigError,
}


def decide_restart(
    budget: RestartBudget,
    death: DeathReport,
    *,
    store: StateStore,
    clock: Clock,
    restart_window_s: float,
) -> tuple[RestartBudget, RestartDecision]:
    """The next budget and the decision, the failure filed in the state file first.

    Raises:
        SupervisorError: the run must end (a terminal kind, or a crash loop); its exit code is
            the kind's.
    """
    kind, hint = death.classification
    budget, decision = decide_after_failure(budget, kind, clock.monotonic())
    store.update(
        lambda s: dataclasses.replace(
            s,
            restart_count=budget.total_restarts,
            last_failure=kind.value,
            last_failure_hint=hint,
            last_failure_at=clock.wall(),
        )
    )
    if decision.end is RunEnd.CRASH_LOOP:
        window = decision.restarts_in_window
        log.error("crash_loop", failure=kind.value, restarts_in_window=window)
        raise CrashLoop(
            f"crash loop: {window} restarts within {restart_window_s:g} s, "
            f"last failure {kind.value}: {hint}"
        )
    if decision.end is not None:
        raise _END_ERRORS[decision.end](hint)
    return budget, decision
