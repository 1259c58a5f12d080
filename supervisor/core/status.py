"""The supervisor's status, folded from its own log events: what `sglang-supervisor status`
shows and `run` publishes as status.json.

Pure: events (the dicts the log tap hands to its sinks, secrets already masked) and the wall
time in, a Status out. The log is the one record of what happened (README "Log events"); the
status is derived from it, so the two cannot disagree. Unknown events and fields of the wrong
type are ignored: a status must never break the log call that feeds it.

Shown states: the runner's (supervisor/core/lifecycle.py ServerState) with `fatal` shown as
`failed`, plus `starting` (before the first launch: cleanup, pre-flight) and `waiting_for_gpus`
(a GPU release wait, before a launch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from supervisor.core.gpu_health import HealthLines, health_lines, read_health_lines
from supervisor.core.load_progress import LoadProgress, Phase
from supervisor.core.xid import XidCounts, counted, read_counts

VERSION = 1
# While SGLang loads, its output is read for the load's progress; once it serves, not at all.
LOADING_STATES = frozenset({"launching", "loading", "warming"})
_RESTART_TIMES_KEPT = 64


@dataclass(frozen=True, slots=True)
class Failure:
    kind: str  # a failure class (README "Failure classes")
    hint: str
    at_s: float


@dataclass(frozen=True, slots=True)
class GpuRelease:
    state: str  # waiting | resetting | released | failed
    detail: str
    at_s: float


@dataclass(frozen=True, slots=True)
class Override:
    """A --hicache-size the supervisor chose instead of the configured one."""

    size_gb: int | None
    source: str  # restart_smaller (the watchdog, kept in state.json) | auto_size (pre-flight)
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    instance: str
    supervisor_pid: int
    supervisor_start_ticks: int | None  # with the PID: the same process, not a reused PID
    started_at_s: float
    restart_window_s: float
    server_state: str = "starting"
    state_since_s: float
    waiting_for_gpus: bool = False
    run_id: str = ""
    server_pid: int | None = None
    argv: tuple[str, ...] = ()  # as launched, secrets masked (the `launching` event's)
    hicache_override: Override | None = None
    next_override: Override | None = None  # logged before the launch it applies to
    restart_count: int = 0
    restart_times_s: tuple[float, ...] = ()
    backoff_until_s: float | None = None
    last_failure: Failure | None = None
    gpu_release: GpuRelease | None = None
    load: LoadProgress | None = None
    exit_code: int | None = None
    end_reason: str | None = None
    gpu_xids: XidCounts = field(default_factory=dict)  # GPU index -> Xid -> count (gpu_event)
    gpu_health: HealthLines = field(default_factory=dict)  # the last gpu_health gate, by GPU
    updated_at_s: float

    @classmethod
    def begin(
        cls,
        *,
        instance: str,
        supervisor_pid: int,
        supervisor_start_ticks: int | None,
        restart_window_s: float,
        now_s: float,
    ) -> Status:
        return cls(
            instance=instance,
            supervisor_pid=supervisor_pid,
            supervisor_start_ticks=supervisor_start_ticks,
            started_at_s=now_s,
            restart_window_s=restart_window_s,
            state_since_s=now_s,
            updated_at_s=now_s,
        )

    @property
    def state(self) -> str:
        return "waiting_for_gpus" if self.waiting_for_gpus else self.server_state

    @property
    def hicache_size_gb(self) -> str | None:
        """--hicache-size as launched (SGLang's last occurrence wins), None when not given."""
        value = None
        for i, arg in enumerate(self.argv):
            if arg == "--hicache-size" and i + 1 < len(self.argv):
                value = self.argv[i + 1]
            elif arg.startswith("--hicache-size="):
                value = arg.partition("=")[2]
        return value

    def key(self) -> tuple[object, ...]:
        """What, when it changes, is written at once rather than at the next throttled write."""
        phase = self.load.phase if self.load is not None else None
        return (self.state, phase, self.run_id, self.server_pid, self.exit_code)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "instance": self.instance,
            "supervisor_pid": self.supervisor_pid,
            "supervisor_start_ticks": self.supervisor_start_ticks,
            "started_at": self.started_at_s,
            "state": self.state,
            "server_state": self.server_state,
            "state_since": self.state_since_s,
            "run_id": self.run_id or None,
            "server_pid": self.server_pid,
            "argv": list(self.argv),
            "hicache_size_gb": self.hicache_size_gb,
            "hicache_override": _plain(self.hicache_override),
            "restart_count": self.restart_count,
            "restart_times": list(self.restart_times_s),
            "restart_window_s": self.restart_window_s,
            "backoff_until": self.backoff_until_s,
            "last_failure": _plain(self.last_failure),
            "gpu_release": _plain(self.gpu_release),
            "load_progress": None if self.load is None else self.load.to_json(),
            "exit_code": self.exit_code,
            "end_reason": self.end_reason,
            "gpu_xids": self.gpu_xids,
            "gpu_health": self.gpu_health,
            "updated_at": self.updated_at_s,
        }

    @classmethod
    def from_json(cls, data: object) -> Status:
        """Raises ValueError/TypeError/KeyError on a document that is not a status file."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") != VERSION:
            raise ValueError(f"unknown status file version {data.get('version')!r}")
        failure, gpu, override = data["last_failure"], data["gpu_release"], data["hicache_override"]
        state = _text(data["state"])
        return cls(
            instance=_text(data["instance"]),
            supervisor_pid=_int(data["supervisor_pid"]),
            supervisor_start_ticks=_opt(_int, data["supervisor_start_ticks"]),
            started_at_s=_num(data["started_at"]),
            restart_window_s=_num(data["restart_window_s"]),
            server_state=_text(data["server_state"]),
            state_since_s=_num(data["state_since"]),
            waiting_for_gpus=state == "waiting_for_gpus",
            run_id=_text(data["run_id"] or ""),
            server_pid=_opt(_int, data["server_pid"]),
            argv=tuple(_text(a) for a in data["argv"]),
            hicache_override=None if override is None else Override(**override),
            restart_count=_int(data["restart_count"]),
            restart_times_s=tuple(_num(t) for t in data["restart_times"]),
            backoff_until_s=_opt(_num, data["backoff_until"]),
            last_failure=None if failure is None else Failure(**_times(failure)),
            gpu_release=None if gpu is None else GpuRelease(**_times(gpu)),
            load=_opt(LoadProgress.from_json, data["load_progress"]),
            exit_code=_opt(_int, data["exit_code"]),
            end_reason=_opt(_text, data["end_reason"]),
            gpu_xids=read_counts(data.get("gpu_xids")),  # absent in files of older versions
            gpu_health=read_health_lines(data.get("gpu_health")),  # absent in older ones too
            updated_at_s=_num(data["updated_at"]),
        )


def _plain(value: Failure | GpuRelease | Override | None) -> dict[str, Any] | None:
    """As JSON, `at_s` written as `at` (seconds since the epoch, as state.json's `*_at`)."""
    if value is None:
        return None
    return {("at" if f.name == "at_s" else f.name): getattr(value, f.name) for f in fields(value)}


def _times(data: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON object of Failure / GpuRelease: `at` (seconds since the epoch) read as at_s."""
    return {("at_s" if k == "at" else k): v for k, v in data.items()}


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _opt(convert: Callable[[Any], Any], value: object) -> Any:
    return None if value is None else convert(value)


# -- the fold ----------------------------------------------------------------------------


Handler = Callable[[Status, Mapping[str, Any], float], Status]


def _enter(status: Status, server_state: str, now_s: float, **changes: Any) -> Status:
    """The runner's state changed (one event per change)."""
    new = replace(status, server_state=server_state, waiting_for_gpus=False, **changes)
    if new.state != status.state:
        new = replace(new, state_since_s=now_s)
    return new


def _launching(status: Status, event: Mapping[str, Any], now_s: float) -> Status:
    argv = event.get("argv")
    new = _enter(
        status,
        "launching",
        now_s,
        run_id=str(event.get("run_id") or ""),
        server_pid=None,
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else (),
        backoff_until_s=None,
        load=LoadProgress.begin(now_s),
        next_override=None,
    )
    override = status.next_override or status.hicache_override
    if override is not None and str(override.size_gb) != new.hicache_size_gb:
        override = None  # the argv changed since: not this launch's
    return replace(new, hicache_override=override)


def _state(name: str, phase: Phase | None = None) -> Handler:
    def handle(status: Status, _event: Mapping[str, Any], now_s: float) -> Status:
        load = status.load
        if phase is not None and load is not None:
            load = load.enter(phase, now_s)
        return _enter(status, name, now_s, load=load)

    return handle


def _stopped(status: Status, _event: Mapping[str, Any], now_s: float) -> Status:
    return _enter(status, "stopped", now_s, server_pid=None, backoff_until_s=None)


def _restarting(status: Status, event: Mapping[str, Any], now_s: float) -> Status:
    delay_s = event.get("delay_s")
    until = now_s + float(delay_s) if isinstance(delay_s, int | float) else None
    times = (*status.restart_times_s, now_s)[-_RESTART_TIMES_KEPT:]
    return _enter(
        status, "backoff", now_s, server_pid=None, backoff_until_s=until, restart_times_s=times
    )


def _fatal(status: Status, event: Mapping[str, Any], now_s: float) -> Status:
    code = event.get("exit_code")
    reason = event.get("reason") or event.get("event")
    return _enter(
        status,
        "failed",
        now_s,
        server_pid=None,
        exit_code=code if isinstance(code, int) else None,
        end_reason=str(reason),
    )


def _launched(status: Status, event: Mapping[str, Any], _now_s: float) -> Status:
    pid = event.get("pid")
    return replace(status, server_pid=pid) if isinstance(pid, int) else status


def _failed(status: Status, event: Mapping[str, Any], now_s: float) -> Status:
    failure = Failure(str(event.get("failure", "")), str(event.get("hint") or ""), now_s)
    return replace(status, last_failure=failure)


def _override(source: str) -> Handler:
    def handle(status: Status, event: Mapping[str, Any], _now_s: float) -> Status:
        size = event.get("hicache_size_gb")
        if source == "auto_size":
            checks = event.get("failed_checks")
            failed = "; ".join(str(c) for c in checks) if isinstance(checks, list) else ""
            reason = f"the configured size does not fit ({failed})" if failed else "no fit"
        else:
            reason = str(event.get("reason") or "")
        override = Override(size if isinstance(size, int) else None, source, reason[:400])
        return replace(status, next_override=override)

    return handle


def _gpu(state: str, describe: Callable[[Mapping[str, Any]], str], waiting: bool) -> Handler:
    def handle(status: Status, event: Mapping[str, Any], now_s: float) -> Status:
        release = GpuRelease(state, describe(event), now_s)
        new = replace(status, gpu_release=release, waiting_for_gpus=waiting)
        if new.state != status.state:
            new = replace(new, state_since_s=now_s)
        return new

    return handle


def _elapsed(event: Mapping[str, Any]) -> str:
    elapsed = event.get("elapsed_s")
    return f"after {elapsed:g} s" if isinstance(elapsed, int | float) else ""


def _server_output(status: Status, event: Mapping[str, Any], now_s: float) -> Status:
    line = event.get("line")
    loading = status.load is not None and status.server_state in LOADING_STATES
    if not loading or status.load is None or not isinstance(line, str):
        return status
    load = status.load.feed(line, now_s)
    return status if load is status.load else replace(status, load=load)


def _gpu_event(status: Status, event: Mapping[str, Any], _now_s: float) -> Status:
    counts = counted(status.gpu_xids, event.get("gpu"), event.get("xid"))
    return status if counts is None else replace(status, gpu_xids=counts)


HANDLERS: dict[str, Handler] = {
    "launching": _launching,
    "server_launched": _launched,
    "loading": _state("loading"),
    "warming": _state("warming", Phase.WARM_UP),
    "ready": _state("ready", Phase.READY),
    "unhealthy": _state("unhealthy"),
    "stopping": _state("stopping"),
    "stopped": _stopped,
    "restarting": _restarting,
    "fatal": _fatal,
    "internal_error": _fatal,
    "server_failed": _failed,
    "server_output": _server_output,
    "hicache_override_applied": _override("restart_smaller"),
    "auto_sized": _override("auto_size"),
    "gpu_release_waiting": _gpu("waiting", lambda e: str(e.get("reason", "")), True),
    "nvml_unanswered": _gpu("waiting", lambda _e: "NVML does not answer", True),
    "gpu_reset_started": _gpu("resetting", lambda e: f"resetting GPU {e.get('gpu')}", True),
    "gpu_reset_failed": _gpu(
        "waiting", lambda e: f"reset of GPU {e.get('gpu')} failed: {e.get('detail')}", True
    ),
    "gpu_release_done": _gpu("released", _elapsed, False),
    "gpu_release_failed": _gpu("failed", lambda e: str(e.get("reason", "")), False),
    "gpu_event": _gpu_event,
    "gpu_health": lambda s, e, _now: replace(s, gpu_health=health_lines(e, s.gpu_health)),
}


def fold(status: Status, event: Mapping[str, Any], now_s: float) -> Status:
    """The status after one log event at wall time `now_s`."""
    handler = HANDLERS.get(str(event.get("event")))
    if handler is None:
        return status
    new = handler(status, event, now_s)
    count = event.get("restart_count")
    if isinstance(count, int) and not isinstance(count, bool) and count != new.restart_count:
        new = replace(new, restart_count=count)
    return new if new is status else replace(new, updated_at_s=now_s)


def restarts_in_window(times_s: tuple[float, ...], window_s: float, now_s: float) -> int:
    """Restarts at `times_s` (seconds since the epoch) within the window ending at `now_s`."""
    return sum(1 for t in times_s if t > now_s - window_s)


def systemd_line(status: Status, now_s: float) -> str:
    """systemd's STATUS= while loading, in the runner's words with the load's progress:
    "loading (loading weights 45% (27/60 shards, ETA 38 s)); restarts 0; run 3f2a…"."""
    progress = status.load.describe(now_s) if status.load is not None else ""
    state = f"{status.server_state} ({progress})" if progress else status.server_state
    return f"{state}; restarts {status.restart_count}; run {status.run_id}"
