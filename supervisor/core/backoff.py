"""Restart budget: capped exponential delay, reset after a stable run, crash loop detection.

Pure: times are passed in. Defaults from prior-art.md §9 (GPUStack: 10 s doubling to 300 s; RBG:
reset after 10 min stable); `max_restarts` within `restart_window_s` bounds the loop so that a
server that cannot come up stops and lets systemd mark the unit failed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tenacity


@dataclass(frozen=True, slots=True, kw_only=True)
class BackoffPolicy:
    initial_s: float = 10.0
    max_s: float = 300.0
    stable_after_s: float = 600.0  # healthy this long => the next failure starts again at initial_s
    max_restarts: int = 5  # more than this many restarts within restart_window_s = crash loop
    restart_window_s: float = 1800.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartDecision:
    """What to do after a failure: wait `delay_s` then relaunch, or give up (crash loop)."""

    give_up: bool
    delay_s: float
    attempt: int  # failures since the last stable run, this one included
    restarts_in_window: int  # restarts already done within the window, before this one


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

    def on_failure(self, now_s: float) -> tuple[RestartBudget, RestartDecision]:
        """Record a failure at `now_s`; decide the delay or a crash loop."""
        window_start = now_s - self.policy.restart_window_s
        recent = tuple(t for t in self.restart_times_s if t > window_start)
        attempt = self.streak + 1
        if len(recent) >= self.policy.max_restarts:
            decision = RestartDecision(
                give_up=True, delay_s=0.0, attempt=attempt, restarts_in_window=len(recent)
            )
            return replace(self, restart_times_s=recent, streak=attempt), decision
        decision = RestartDecision(
            give_up=False,
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
        if self.streak and now_s - healthy_since_s >= self.policy.stable_after_s:
            return replace(self, streak=0)
        return self
