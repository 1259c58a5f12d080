"""Which log event changes which Prometheus metric: event dicts in, metric updates out.

The documented log events are the one record of what happened; the metrics are derived from
them (supervisor/adapters/metrics.py applies the updates), so the two never disagree. Every label
value comes from a bounded set (failure kinds, states, a few named reasons), never free text.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core.classify import FailureKind
from supervisor.core.gpu_health import RecoveryAction, Verdict
from supervisor.core.lifecycle import HealthStatus, ServerState

PREFIX = "sglang_supervisor_"


class Kind(str, enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its name without PREFIX, type, help, label and the label values it starts
    with (a counter's known labels are exported at 0 from the start, so rate() sees the first
    increment), and a histogram's buckets in its unit. Several labels are comma-separated
    ("gpu,xid"), and so are their values in an Update's `label` ("0,48")."""

    name: str
    kind: Kind
    help: str
    label: str | None = None
    initial: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


_FAILURES = tuple(k.value for k in FailureKind)
STOPPED_EXIT = "stopped"  # server_exits_total: a stop the supervisor asked for
_HEALTH_REASONS = {
    HealthStatus.REFUSED.value: "refused",
    HealthStatus.WARMING.value: "http_503",
    HealthStatus.TIMEOUT.value: "timeout",
    HealthStatus.NOT_FOUND.value: "http_404",
    HealthStatus.ERROR.value: "error",
}
# The watchdog's reasons are sentences (core/policy.py); the label is the rule that fired.
_KILL_RULES = (
    ("host memory available", "kill level", "host_kill_level"),
    ("server tree uses", "", "tree_budget"),
    ("host memory falls", "", "host_trend"),
    ("server tree grows", "", "tree_trend"),
    ("SIGTERM grace", "", "terminate_grace_expired"),
    ("host memory available", "terminate level", "host_terminate_level"),
)
_KILL_REASONS = (*dict.fromkeys(rule for _, _, rule in _KILL_RULES), "other")
_INCIDENT_KINDS = ("memory_kill", "memory_terminate", "gpu_unrecoverable", "gpu_xid")
OTHER = "other"

SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("build_info", Kind.GAUGE, "The supervisor's version (always 1).", "version"),
    MetricSpec(
        "server_state",
        Kind.GAUGE,
        "1 for the server's current state, 0 for the others.",
        "state",
        tuple(s.value for s in ServerState),
    ),
    MetricSpec(
        "server_start_time_seconds", Kind.GAUGE, "Unix time the running server was launched."
    ),
    MetricSpec(
        "startup_duration_seconds",
        Kind.HISTOGRAM,
        "Launch to ready (200 on the health path).",
        buckets=(10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200),
    ),
    MetricSpec("restarts_total", Kind.COUNTER, "Restarts, by failure kind.", "reason", _FAILURES),
    MetricSpec(
        "server_exits_total",
        Kind.COUNTER,
        "Ends of a server tree, by failure kind, or stopped.",
        "kind",
        (*_FAILURES, STOPPED_EXIT),
    ),
    MetricSpec(
        "drains_cut_total",
        Kind.COUNTER,
        "Stops whose grace ran out while the server drained (requests in flight were reset).",
    ),
    MetricSpec(
        "health_check_duration_seconds",
        Kind.HISTOGRAM,
        "Health checks of a ready server, each until its answer.",
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25),
    ),
    MetricSpec(
        "health_check_failures_total",
        Kind.COUNTER,
        "Failed health checks of a ready server, by answer.",
        "reason",
        tuple(_HEALTH_REASONS.values()),
    ),
    MetricSpec(
        "watchdog_kills_total",
        Kind.COUNTER,
        "Memory watchdog SIGKILLs (and SIGTERMs: host_terminate_level), by the rule that fired.",
        "reason",
        _KILL_REASONS,
    ),
    MetricSpec(
        "host_memory_available_bytes",
        Kind.GAUGE,
        "MemAvailable (capped by cgroup headroom) at the watchdog's last report.",
    ),
    MetricSpec(
        "tree_memory_bytes",
        Kind.GAUGE,
        "The server tree's anon + shmem (its cgroup's, or RssAnon + RssShmem), read at the scrape.",
    ),
    MetricSpec("tree_budget_bytes", Kind.GAUGE, "The tree's expected total (the pre-flight's)."),
    MetricSpec(
        "hicache_size_bytes_per_rank",
        Kind.GAUGE,
        "--hicache-size of the running launch, per rank (0: no HiCache).",
    ),
    MetricSpec("hicache_shrinks_total", Kind.COUNTER, "Restart-smaller shrinks of --hicache-size."),
    MetricSpec(
        "gpu_release_wait_seconds",
        Kind.HISTOGRAM,
        "Waits for the GPUs to be released after a server tree ended.",
        buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 240, 480),
    ),
    MetricSpec(
        "gpu_resets_total",
        Kind.COUNTER,
        "GPU reset commands, by result.",
        "result",
        ("ok", "failed"),
    ),
    MetricSpec(
        "incidents_total", Kind.COUNTER, "Incident files written, by kind.", "kind", _INCIDENT_KINDS
    ),
    MetricSpec(
        "gpu_xid_total", Kind.COUNTER, "Xid errors the driver reported, by GPU and Xid.", "gpu,xid"
    ),
    MetricSpec(
        "gpu_recovery_action",
        Kind.GAUGE,
        "The recovery action the driver last asked for at a GPU event (NVML's: 0 none, 1 GPU "
        "reset, 2 node reboot, 3 drain P2P, 4 drain and reset, ...).",
        "gpu",
    ),
    MetricSpec("gpu_health", Kind.GAUGE, "1: each GPU's verdict at the last gate.", "gpu,verdict"),
    MetricSpec("gpu_remap_pending", Kind.GAUGE, "1: a row remap waits for a reset.", "gpu"),
)


class Op(str, enum.Enum):
    INC = "inc"
    SET = "set"
    UNSET = "unset"  # a gauge whose value is no longer known (no server): not exported
    OBSERVE = "observe"


@dataclass(frozen=True, slots=True)
class Update:
    metric: str  # a MetricSpec name
    op: Op
    value: float = 1.0
    label: str | None = None  # the value of the spec's label


def _bounded(value: Any, known: Sequence[str]) -> str:
    return value if isinstance(value, str) and value in known else OTHER


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def kill_rule(reason: Any) -> str:
    """The watchdog rule a kill's reason sentence names (`other` for one not known here)."""
    text = reason if isinstance(reason, str) else ""
    for start, also, rule in _KILL_RULES:
        if text.startswith(start) and also in text:
            return rule
    return OTHER


_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,39}")


def incident_kind(kind: Any) -> str:
    """Incident kinds are identifiers in the code; anything else would be free text."""
    return kind if isinstance(kind, str) and _IDENTIFIER.fullmatch(kind) else OTHER


# The runner's state-change events are named after the state, but for this one.
_STATE_OF_EVENT = {s.value: s.value for s in ServerState} | {"restarting": "backoff"}


class EventMapper:
    """Turns each log event into the metric updates it implies.

    Keeps the little a mapping needs across events (when this launch started, whether a server
    is running); not thread-safe: the adapter calls it under its lock.
    """

    def __init__(self, hicache_bytes: Callable[[Sequence[str]], int | None]) -> None:
        """`hicache_bytes`: the --hicache-size of a launch argv in bytes per rank (0 without
        HiCache, None when SGLang sizes the pool itself)."""
        self._hicache_bytes = hicache_bytes
        self._state = ServerState.STOPPED.value
        self._launched_at_s: float | None = None
        self._server_running = False

    def initial(self, version: str) -> list[Update]:
        """The updates that hold before any event."""
        return [Update("build_info", Op.SET, 1.0, version), *self._state_updates(self._state)]

    def feed(self, event: Mapping[str, Any], *, mono_s: float, wall_s: float) -> list[Update]:
        """The updates `event` implies; `mono_s`/`wall_s` are the time it was logged."""
        name = event.get("event")
        if not isinstance(name, str):
            return []
        updates = self._lifecycle(name, event, mono_s, wall_s)
        state = _STATE_OF_EVENT.get(name)
        if state is not None and state != self._state:
            self._state = state
            updates += self._state_updates(state)
        handler = _HANDLERS.get(name)
        if handler is not None:
            updates += handler(event)
        return updates

    def _state_updates(self, current: str) -> list[Update]:
        return [
            Update("server_state", Op.SET, 1.0 if s.value == current else 0.0, s.value)
            for s in ServerState
        ]

    def _lifecycle(
        self, name: str, event: Mapping[str, Any], mono_s: float, wall_s: float
    ) -> list[Update]:
        """Launch, readiness, and the end of a server tree."""
        if name == "launching":
            self._launched_at_s = mono_s
            argv = _argv(event.get("argv"))
            size = self._hicache_bytes(argv) if argv is not None else None
            hicache = Update("hicache_size_bytes_per_rank", Op.UNSET)
            if size is not None:
                hicache = Update("hicache_size_bytes_per_rank", Op.SET, float(size))
            return [hicache]
        if name == "server_launched":
            self._server_running = True
            return [Update("server_start_time_seconds", Op.SET, wall_s)]
        if name == "ready" and self._launched_at_s is not None:
            took_s, self._launched_at_s = mono_s - self._launched_at_s, None
            return [Update("startup_duration_seconds", Op.OBSERVE, took_s)]
        if name == "restarting":
            return [
                Update("restarts_total", Op.INC, label=_bounded(event.get("failure"), _FAILURES))
            ]
        ended: str | None = None
        if name == "server_failed":
            ended = _bounded(event.get("failure"), _FAILURES)
        elif name == "stopped":  # after server_failed the tree had ended already
            ended = STOPPED_EXIT
        if ended is None or not self._server_running:
            return []
        self._server_running = False
        self._launched_at_s = None
        return [
            Update("server_exits_total", Op.INC, label=ended),
            Update("server_start_time_seconds", Op.UNSET),
            Update("tree_memory_bytes", Op.UNSET),
        ]


def _argv(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _memory(event: Mapping[str, Any]) -> list[Update]:
    """The watchdog's readings, carried by its report, warnings and kills."""
    updates = []
    for field, metric in (
        ("available_bytes", "host_memory_available_bytes"),
        ("tree_charged_bytes", "tree_memory_bytes"),
    ):
        value = _number(event.get(field))
        if value is not None:
            updates.append(Update(metric, Op.SET, value))
    return updates


def _killed(event: Mapping[str, Any]) -> list[Update]:
    rule = kill_rule(event.get("reason"))
    return [Update("watchdog_kills_total", Op.INC, label=rule), *_memory(event)]


def _limits(event: Mapping[str, Any]) -> list[Update]:
    budget = _number(event.get("tree_budget_bytes"))
    if budget is None:  # no pre-flight, no budget
        return [Update("tree_budget_bytes", Op.UNSET)]
    return [Update("tree_budget_bytes", Op.SET, budget)]


def _health_check(event: Mapping[str, Any]) -> list[Update]:
    """Liveness checks only: while loading, a refused connection is the expected answer."""
    if event.get("state") != ServerState.READY.value:
        return []
    updates = []
    duration_s = _number(event.get("duration_s"))
    if duration_s is not None:
        updates.append(Update("health_check_duration_seconds", Op.OBSERVE, duration_s))
    result = event.get("result")
    if result != HealthStatus.READY.value:
        reason = _HEALTH_REASONS.get(result, OTHER) if isinstance(result, str) else OTHER
        updates.append(Update("health_check_failures_total", Op.INC, label=reason))
    return updates


def _gpu_release(event: Mapping[str, Any]) -> list[Update]:
    elapsed_s = _number(event.get("elapsed_s"))
    if elapsed_s is None:
        return []
    return [Update("gpu_release_wait_seconds", Op.OBSERVE, elapsed_s)]


_ACTION_CODES = {a.name.lower(): a.value for a in RecoveryAction}
_VERDICTS = tuple(v.value for v in Verdict)


def _small_int(value: Any, limit: int) -> str:
    """A GPU index or an Xid as a label: an integer below `limit`, else `other`."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit
    return str(value) if ok else OTHER


def _gpu_event(event: Mapping[str, Any]) -> list[Update]:
    gpu = _small_int(event.get("gpu"), 1024)
    updates = []
    if event.get("xid") is not None:
        xid = _small_int(event.get("xid"), 1024)
        updates.append(Update("gpu_xid_total", Op.INC, label=f"{gpu},{xid}"))
    action = event.get("driver_action")  # NVML's own reading, not the action followed
    code = _ACTION_CODES.get(action) if isinstance(action, str) else None
    if code is not None:
        updates.append(Update("gpu_recovery_action", Op.SET, float(code), gpu))
    return updates


def _gpu_health(event: Mapping[str, Any]) -> list[Update]:
    """Each GPU's verdict at a health gate (1, its other verdicts 0) and its pending remap."""
    updates = []
    for g in (g for g in event.get("gpus") or () if isinstance(g, dict)):
        gpu, remap = _small_int(g.get("gpu"), 1024), g.get("remap_pending")
        is_it = {v: float(v == g.get("verdict")) for v in _VERDICTS}
        updates += [Update("gpu_health", Op.SET, one, f"{gpu},{v}") for v, one in is_it.items()]
        op = Op.SET if isinstance(remap, bool) else Op.UNSET  # unknown: not exported
        updates.append(Update("gpu_remap_pending", op, float(remap is True), gpu))
    return updates


_HANDLERS: dict[str, Callable[[Mapping[str, Any]], list[Update]]] = {
    "memory_report": _memory,
    "memory_warn": _memory,
    "server_killed": _killed,
    "server_terminated": _killed,
    "watchdog_limits": _limits,
    "health_check": _health_check,
    "hicache_shrunk": lambda _e: [Update("hicache_shrinks_total", Op.INC)],
    "drain_cut": lambda _e: [Update("drains_cut_total", Op.INC)],
    "gpu_release_done": _gpu_release,
    "gpu_release_failed": _gpu_release,
    "gpu_reset_done": lambda _e: [Update("gpu_resets_total", Op.INC, label="ok")],
    "gpu_reset_failed": lambda _e: [Update("gpu_resets_total", Op.INC, label="failed")],
    "incident_written": lambda e: [
        Update("incidents_total", Op.INC, label=incident_kind(e.get("kind")))
    ],
    "gpu_event": _gpu_event,
    "gpu_health": _gpu_health,
}
