"""The server's lifecycle states, the legal transitions between them, and the startup deadline.

Pure: the runner (supervisor/runner.py) feeds times and readings and acts on the answers.

Theory of operation (supervisord's vocabulary, h11's table)::

    stopped ──> launching ──> loading ──> warming ──> ready
                    │            │           │          │
                    └────────────┴─────┬─────┴──────────┘
                                       v
                                   unhealthy ──> backoff ──> launching   (restart)
                                       │            │
                                       └──> fatal   └──> stopping         (crash loop / signal)

    any live state ──> stopping ──> stopped                               (SIGTERM, SIGINT)

`loading` = connection refused (SGLang serves HTTP only once every scheduler is ready);
`warming` = 503 (warm-up request in flight); `ready` = 200. `unhealthy` = the server was found
dead (exited, rank missing/zombie/stopped, health failing, startup stuck) and its tree is being
killed. Loading takes many minutes, so the startup limit is progress-aware (StartupWatch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class ServerState(str, Enum):
    """Where the supervised server is; the value is the log event name of the transition."""

    STOPPED = "stopped"
    LAUNCHING = "launching"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    FATAL = "fatal"


_S = ServerState

# FATAL: the run ends with a non-zero exit; reachable from every state but the end states, as a
# refusal can come before the first launch (the pre-flight) or during any wait (GPU release).
TRANSITIONS: dict[ServerState, frozenset[ServerState]] = {
    _S.STOPPED: frozenset({_S.LAUNCHING, _S.FATAL}),
    # LAUNCHING -> UNHEALTHY: the process died before the first check (bad flag, port in use).
    _S.LAUNCHING: frozenset({_S.LOADING, _S.UNHEALTHY, _S.STOPPING, _S.FATAL}),
    # LOADING -> READY: --skip-server-warmup, or a 503 phase shorter than one probe interval.
    _S.LOADING: frozenset({_S.WARMING, _S.READY, _S.UNHEALTHY, _S.STOPPING, _S.FATAL}),
    _S.WARMING: frozenset({_S.READY, _S.UNHEALTHY, _S.STOPPING, _S.FATAL}),
    _S.READY: frozenset({_S.UNHEALTHY, _S.STOPPING, _S.FATAL}),
    # UNHEALTHY -> STOPPING: a stop signal arrived while the dead tree was being killed.
    _S.UNHEALTHY: frozenset({_S.BACKOFF, _S.FATAL, _S.STOPPING}),
    _S.BACKOFF: frozenset({_S.LAUNCHING, _S.STOPPING, _S.FATAL}),
    _S.STOPPING: frozenset({_S.STOPPED, _S.FATAL}),
    _S.FATAL: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A transition the table does not allow: a bug in the runner, never an operator error."""


def check_transition(current: ServerState, new: ServerState) -> ServerState:
    """Return `new` when current -> new is legal.

    Raises:
        IllegalTransition: the table forbids it (the state is left unchanged by the caller).
    """
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"illegal server state transition {current.value} -> {new.value}")
    return new


class HealthStatus(str, Enum):
    """One answer of the health endpoint, as the readiness and liveness checks read it."""

    REFUSED = "refused"  # nothing listens yet: still loading (docs/sglang.md §4)
    WARMING = "warming"  # 503: warming up, draining, or unhealthy after ready
    READY = "ready"  # 200
    TIMEOUT = "timeout"  # no answer within health_timeout
    NOT_FOUND = "not_found"  # 404: the server is up, the health path is not one of its routes
    ERROR = "error"  # any other status or transport error


def state_for_startup_probe(status: HealthStatus) -> ServerState | None:
    """The startup state a probe answer implies; None when it says nothing new."""
    if status is HealthStatus.READY:
        return ServerState.READY
    if status is HealthStatus.WARMING:
        return ServerState.WARMING
    return None


class StartupVerdict(str, Enum):
    OK = "ok"
    STALLED = "stalled"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True)
class StartupWatch:
    """Progress of one startup: the server makes progress while its tree's memory (host or GPU)
    reaches a new peak or it writes log lines. Immutable; `observe` returns the next value."""

    started_at_s: float
    last_progress_at_s: float
    peak_memory_bytes: int = 0
    log_lines: int = 0

    @classmethod
    def begin(cls, now_s: float) -> StartupWatch:
        return cls(started_at_s=now_s, last_progress_at_s=now_s)

    def observe(
        self, now_s: float, memory_bytes: int, log_lines: int, min_growth_bytes: int
    ) -> StartupWatch:
        """Fold one reading in. Memory counts only above the previous peak by `min_growth_bytes`
        so that allocator noise of an idle process is not mistaken for loading."""
        progressed = False
        peak = self.peak_memory_bytes
        if memory_bytes > peak + min_growth_bytes or (peak == 0 and memory_bytes > 0):
            peak = memory_bytes
            progressed = True
        if log_lines > self.log_lines:
            progressed = True
        return replace(
            self,
            last_progress_at_s=now_s if progressed else self.last_progress_at_s,
            peak_memory_bytes=max(peak, self.peak_memory_bytes),
            log_lines=max(log_lines, self.log_lines),
        )

    def verdict(self, now_s: float, stall_timeout_s: float, timeout_s: float) -> StartupVerdict:
        """TIMED_OUT past the hard limit, STALLED after `stall_timeout_s` without progress."""
        if now_s - self.started_at_s >= timeout_s:
            return StartupVerdict.TIMED_OUT
        if now_s - self.last_progress_at_s >= stall_timeout_s:
            return StartupVerdict.STALLED
        return StartupVerdict.OK

    def time_left_s(self, now_s: float, stall_timeout_s: float, timeout_s: float) -> float:
        """Seconds until the earlier of the two deadlines (for systemd's EXTEND_TIMEOUT_USEC)."""
        stall_left = self.last_progress_at_s + stall_timeout_s - now_s
        hard_left = self.started_at_s + timeout_s - now_s
        return max(0.0, min(stall_left, hard_left))
