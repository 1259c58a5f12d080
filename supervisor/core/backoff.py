"""What follows a failure: which failures end the run, the restart budget (capped exponential
delay, reset after a stable run), crash-loop detection, and a start failure that repeats.

Pure: times are passed in. Defaults follow peers (docs/peers.md: GPUStack waits 10 s doubling to
300 s, RBG forgets failures after 10 min stable); `max_restarts` within `restart_window_s`
bounds the loop so that a server that cannot come up stops and lets systemd mark the unit
failed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

import tenacity

from supervisor.core.classify import FailureKind


class RunEnd(str, Enum):
    """Why a failure ends the run instead of a restart (each has its exit code)."""

    ARGS_REJECTED = "args_rejected"  # SGLang refused its flags: the same argv fails again
    GPU_UNRECOVERABLE = "gpu_unrecoverable"  # a GPU stays held: relaunching onto it is unsafe
    STARTUP_FAILED = "startup_failed"  # loaded, with progress, for the whole startup_timeout
    CRASH_LOOP = "crash_loop"  # too many restarts within the window
    BAD_CONFIG = "bad_config"  # the supervisor's own setting is wrong (e.g. its health path)
    # The same failure twice in a row before the server was ever ready: a missing module, a rank
    # dying in its first init. The same launch fails the same way again.
    START_REPEATED = "start_repeated"


_TERMINAL: dict[FailureKind, RunEnd] = {
    FailureKind.BAD_FLAGS: RunEnd.ARGS_REJECTED,
    FailureKind.GPU_DIRTY: RunEnd.GPU_UNRECOVERABLE,
    FailureKind.GPU_XID_FATAL: RunEnd.GPU_UNRECOVERABLE,  # a node reboot or a drain is needed
    FailureKind.HEALTH_PATH_MISSING: RunEnd.BAD_CONFIG,
    # A load that progressed for the whole hard limit would take as long again.
    FailureKind.STARTUP_TIMEOUT: RunEnd.STARTUP_FAILED,
}


# Not a property of the launch: host memory depends on what else runs on the host, and after a
# memory kill restart-smaller launches with a smaller --hicache-size. An Xid is the GPU's or the
# driver's, and the relaunch after one comes after a reset or onto a GPU the health gate passed;
# a GPU that keeps failing meets the crash-loop limit instead. A lost peer is another node's
# failure, not this launch's.
_NOT_DETERMINISTIC = frozenset(
    {
        FailureKind.MEMORY_KILL,
        FailureKind.KERNEL_OOM_KILLED,
        FailureKind.GPU_XID,
        FailureKind.PEER_LOST,
    }
)


# One death seen two ways: when a rank dies at init, the monitor may see the rank gone first
# (rank_crash) or the main process's exit first (exited_unexpectedly), a race between two
# readings of one event. For "the same failure again" they are one.
_SAME_START_FAILURE: dict[FailureKind, FailureKind] = {
    FailureKind.EXITED_UNEXPECTEDLY: FailureKind.RANK_CRASH,
}


def _start_failure(kind: FailureKind | None) -> FailureKind | None:
    return None if kind is None else _SAME_START_FAILURE.get(kind, kind)


def terminal_end(kind: FailureKind) -> RunEnd | None:
    """The end of the run a failure of this kind means, or None when a restart can help."""
    return _TERMINAL.get(kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackoffPolicy:
    initial_s: float = 10.0
    max_s: float = 300.0
    stable_after_s: float = 600.0  # healthy this long => the next failure starts again at initial_s
    max_restarts: int = 5  # more than this many restarts within restart_window_s = crash loop
    restart_window_s: float = 1800.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartDecision:
    """What to do after a failure: wait `delay_s` then relaunch, or end the run (`end`)."""

    end: RunEnd | None
    delay_s: float
    attempt: int  # failures since the last stable run, this one included
    restarts_in_window: int  # restarts already done within the window, before this one

    @property
    def give_up(self) -> bool:
        return self.end is not None


def backoff_delay_s(policy: BackoffPolicy, attempt: int) -> float:
    """Delay before restart number `attempt` (1-based): initial_s · 2^(attempt-1), capped."""
    wait = tenacity.wait_exponential(multiplier=policy.initial_s, exp_base=2, max=policy.max_s)
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = max(1, attempt)
    return float(wait(state))


@dataclass(frozen=True, slots=True)
class RestartBudget:
    """Immutable restart bookkeeping; every method returns the next value."""

    policy: BackoffPolicy
    restart_times_s: tuple[float, ...] = ()
    streak: int = 0  # failures since the last stable run
    total_restarts: int = 0
    ever_ready: bool = False  # the server was ready at least once under this budget
    last_kind: FailureKind | None = None  # the kind of the previous failure

    def restarts_in_window(self, now_s: float) -> int:
        """Restarts within the window ending at `now_s`."""
        window_start = now_s - self.policy.restart_window_s
        return sum(1 for t in self.restart_times_s if t > window_start)

    def on_failure(self, now_s: float) -> tuple[RestartBudget, RestartDecision]:
        """Record a failure at `now_s`; decide the delay or a crash loop."""
        window_start = now_s - self.policy.restart_window_s
        recent = tuple(t for t in self.restart_times_s if t > window_start)
        attempt = self.streak + 1
        if len(recent) >= self.policy.max_restarts:
            decision = RestartDecision(
                end=RunEnd.CRASH_LOOP, delay_s=0.0, attempt=attempt, restarts_in_window=len(recent)
            )
            return replace(self, restart_times_s=recent, streak=attempt), decision
        decision = RestartDecision(
            end=None,
            delay_s=backoff_delay_s(self.policy, attempt),
            attempt=attempt,
            restarts_in_window=len(recent),
        )
        return (
            replace(
                self,
                restart_times_s=(*recent, now_s),
                streak=attempt,
                total_restarts=self.total_restarts + 1,
            ),
            decision,
        )

    def on_healthy(self, healthy_since_s: float, now_s: float) -> RestartBudget:
        """Forget the failure streak once the server has been healthy for `stable_after_s`."""
        budget = self if self.ever_ready else replace(self, ever_ready=True)
        if budget.streak and now_s - healthy_since_s >= budget.policy.stable_after_s:
            return replace(budget, streak=0)
        return budget

    def repeats_start_failure(self, kind: FailureKind, was_ready: bool) -> bool:
        """Whether `kind` fails a start the way the previous launch failed, with no ready
        server in between: relaunching the same argv would fail the same way again."""
        return (
            not (was_ready or self.ever_ready)
            and _start_failure(kind) is _start_failure(self.last_kind)
            and kind not in _NOT_DETERMINISTIC
        )


def delay_before_start_s(budget: RestartBudget, now_s: float) -> float:
    """What is left of the backoff the last failure earned, at a new start.

    For a launcher that starts the next run at once (LeaderWorkerSet recreates a group within
    seconds): the delay a relaunch in place would have waited is waited before the start instead,
    less the time already gone since that failure.
    """
    window_start = now_s - budget.policy.restart_window_s
    recent = [t for t in budget.restart_times_s if t > window_start]
    if not recent:
        return 0.0
    earned_s = backoff_delay_s(budget.policy, len(recent))
    return max(0.0, earned_s - max(0.0, now_s - max(recent)))


def decide_after_failure(
    budget: RestartBudget, kind: FailureKind, now_s: float, *, was_ready: bool = False
) -> tuple[RestartBudget, RestartDecision]:
    """The next budget and what to do: end the run (a terminal kind, the same start failure
    twice before the server was ever ready, or a crash loop) or wait.

    A failure that ends the run is not counted against the budget: the run ends either way.
    """
    end = terminal_end(kind)
    if end is None and budget.repeats_start_failure(kind, was_ready):
        end = RunEnd.START_REPEATED
    if end is not None:
        return budget, RestartDecision(
            end=end,
            delay_s=0.0,
            attempt=budget.streak + 1,
            restarts_in_window=budget.restarts_in_window(now_s),
        )
    seen = replace(budget, ever_ready=budget.ever_ready or was_ready, last_kind=kind)
    return seen.on_failure(now_s)
