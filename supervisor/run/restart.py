"""After a death: file it in the state file, then relaunch after a delay or end the run with
the error (and exit code) its kind calls for.

The restart budget's window lives in the state file, so a supervisor that systemd starts again
after a crash loop goes on with it instead of starting fresh. The core counts on the monotonic
clock, which does not survive a restart: the times are stored as wall-clock epoch seconds and
converted here, at the edge.

In group mode nothing is restarted in place (run/group_mode.py): the death is filed the same
way, then the run ends with exit 8 so that the launcher recreates the whole group.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import structlog

from supervisor.core.backoff import (
    BackoffPolicy,
    RestartBudget,
    RestartDecision,
    RunEnd,
    decide_after_failure,
)
from supervisor.core.lifecycle import ServerState
from supervisor.core.ports import Clock
from supervisor.errors import (
    ConfigError,
    CrashLoop,
    GpuUnrecoverable,
    ServerArgsRejected,
    StartupFailed,
    SupervisorError,
)
from supervisor.run import group_mode
from supervisor.run.death import DeathReport
from supervisor.run.events import StopRequested
from supervisor.run.state import RunState, StateStore

if TYPE_CHECKING:
    from supervisor.run.runner import Runner

log = structlog.get_logger("supervisor.run")

_END_ERRORS: dict[RunEnd, type[SupervisorError]] = {
    RunEnd.ARGS_REJECTED: ServerArgsRejected,
    RunEnd.GPU_UNRECOVERABLE: GpuUnrecoverable,
    RunEnd.STARTUP_FAILED: StartupFailed,
    RunEnd.CRASH_LOOP: CrashLoop,
    RunEnd.BAD_CONFIG: ConfigError,
    RunEnd.START_REPEATED: StartupFailed,
}


def restore_budget(state: RunState, policy: BackoffPolicy, clock: Clock) -> RestartBudget:
    """The budget an earlier supervisor of this instance left in the state file.

    A time ahead of the wall clock (it was stepped back since) counts as now: kept for a whole
    window rather than dropped.
    """
    now_wall, now_mono = clock.wall(), clock.monotonic()
    times = tuple(now_mono - max(0.0, now_wall - t) for t in state.restart_times)
    budget = RestartBudget(policy, restart_times_s=times, total_restarts=state.restart_count)
    in_window = budget.restarts_in_window(now_mono)
    if in_window:
        log.info(
            "restart_budget_restored",
            restarts_in_window=in_window,
            max_restarts=policy.max_restarts,
            restart_window_s=policy.restart_window_s,
        )
    return budget


def restart_times_wall(budget: RestartBudget, clock: Clock) -> tuple[float, ...]:
    """The budget's restart times as wall-clock epoch seconds, for the state file."""
    offset = clock.wall() - clock.monotonic()
    return tuple(round(t + offset, 3) for t in budget.restart_times_s)


def decide_restart(
    budget: RestartBudget,
    death: DeathReport,
    *,
    store: StateStore,
    clock: Clock,
    restart_window_s: float,
) -> tuple[RestartBudget, RestartDecision]:
    """The next budget and the decision, the failure (and the budget's window) filed in the
    state file first.

    Raises:
        SupervisorError: the run must end (a terminal kind, the same start failure twice, or a
            crash loop); its exit code is the kind's.
    """
    kind, hint = death.classification
    budget, decision = decide_after_failure(
        budget, kind, clock.monotonic(), was_ready=death.was_ready
    )
    store.update(
        lambda s: dataclasses.replace(
            s,
            restart_count=budget.total_restarts,
            restart_times=restart_times_wall(budget, clock),
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
    if decision.end is RunEnd.START_REPEATED:
        raise StartupFailed(f"the same failure twice before ready: {kind.value}: {hint}")
    if decision.end is not None:
        raise _END_ERRORS[decision.end](hint)
    return budget, decision


def after_death(runner: Runner, death: DeathReport) -> float:
    """The delay before the next launch (the `restarting` event); raises when the run must end
    instead, in group mode always (GroupMustRecreate, once the GPUs are released)."""
    runner.budget, decision = decide_restart(
        runner.budget,
        death,
        store=runner.store,
        clock=runner.clock,
        restart_window_s=runner.run_cfg.restart_window_s,
    )
    if runner.settings.group is not None:
        group_mode.recreate(runner, death)
    runner.set_state(
        ServerState.BACKOFF,
        failure=death.classification.kind.value,
        delay_s=decision.delay_s,
        attempt=decision.attempt,
        restart_count=runner.budget.total_restarts,
        event_name="restarting",
    )
    return decision.delay_s


def backoff(runner: Runner, delay_s: float) -> bool:
    """Wait `delay_s`; False when a stop signal arrived meanwhile."""
    try:
        runner.wait_clock.sleep(delay_s)
    except StopRequested as stop:
        runner.stopped_while_waiting(stop.event.name)
        return False
    finally:
        runner.wait_clock.held.clear()  # watchdog events of a dead server are stale
    return True
