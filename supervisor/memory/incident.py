"""Incident reports: one JSON file per incident in the state directory, written atomically, plus
one structured log event. Later steps (tree gone, GPUs released, relaunched) are appended.

Never holds secrets: log lines pass through the caller's redaction and a last regex pass here.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from supervisor.adapters.clock import SystemClock
from supervisor.atomic_file import write_text_atomic
from supervisor.core.policy import Decision, Limits, Reading
from supervisor.core.ports import Clock
from supervisor.core.readings import GpuState, ProcessInfo
from supervisor.core.redact import redact_line
from supervisor.log import scrub
from supervisor.run.state import KEEP_FILES, prune

log = structlog.get_logger("supervisor.incident")

TOP_PROCESSES = 10


def utc(wall_s: float, fmt: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    """A wall-clock time as UTC text (ISO 8601 by default)."""
    return datetime.datetime.fromtimestamp(wall_s, tz=datetime.timezone.utc).strftime(fmt)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def reading_dict(r: Reading, t0: float) -> dict[str, Any]:
    return {
        "t_s": round(r.t_s - t0, 4),
        "available_bytes": r.available_bytes,
        "tree_charged_bytes": r.tree_charged_bytes,
        "psi_some_avg10": r.psi_some_avg10,
        "psi_full_avg10": r.psi_full_avg10,
    }


def process_dict(p: ProcessInfo) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "ppid": p.ppid,
        "state": p.state,
        "title": redact_line(p.title),
        "rss_anon_bytes": p.rss_anon_bytes,
        "rss_shmem_bytes": p.rss_shmem_bytes,
        "rss_file_bytes": p.rss_file_bytes,
        "charged_bytes": p.charged_bytes,
    }


def gpu_dict(g: GpuState) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "used_bytes": g.used_bytes,
        "total_bytes": g.total_bytes,
        "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in g.processes],
    }


def memory_report(
    *,
    decision: Decision,
    limits: Limits,
    history: Sequence[Reading],
    tree: Iterable[ProcessInfo],
    gpus: tuple[float, tuple[GpuState, ...] | None] | None,
    log_tail: Sequence[str],
    now_s: float,
    proc_root: Path = Path("/proc"),
    redact: Callable[[str], str] = redact_line,
) -> dict[str, Any]:
    """Everything a memory incident records, as plain JSON data."""
    t0 = history[0].t_s if history else now_s
    top = sorted(tree, key=lambda p: p.charged_bytes, reverse=True)[:TOP_PROCESSES]
    gpu_part: dict[str, Any]
    if gpus is None:
        gpu_part = {"state": "not read"}
    elif gpus[1] is None:
        gpu_part = {"state": "unknown", "age_s": round(now_s - gpus[0], 3)}
    else:
        gpu_part = {"age_s": round(now_s - gpus[0], 3), "gpus": [gpu_dict(g) for g in gpus[1]]}
    meminfo = _read_text(proc_root / "meminfo")
    psi = _read_text(proc_root / "pressure" / "memory")
    return {
        "decision": {
            "verdict": decision.verdict.value,
            "reason": decision.reason,
            "predicted_by_trend": decision.predicted,
            "available_drop_bytes_per_s": round(decision.available_drop_bytes_per_s),
            "tree_growth_bytes_per_s": round(decision.tree_growth_bytes_per_s),
            "next_interval_s": decision.next_interval_s,
        },
        "thresholds": {
            **decision.thresholds(),
            "tree_budget_bytes": limits.tree_budget_bytes,
            "tree_kill_bytes": limits.tree_kill_bytes,
            "warn_ticks": limits.warn_ticks,
            "terminate_grace_s": limits.terminate_grace_s,
            "assumed_ramp_bytes_per_s": limits.worst_ramp_bytes_per_s,
        },
        "ticks": [reading_dict(r, t0) for r in history],
        "meminfo": meminfo.splitlines() if meminfo is not None else None,
        "pressure_memory": psi.splitlines() if psi is not None else None,
        "top_processes": [process_dict(p) for p in top],
        "gpu_snapshot": gpu_part,
        "server_log_tail": [redact_line(redact(line)) for line in log_tail],
    }


def opener(
    state_dir: Path, kind: str, keep: int = KEEP_FILES
) -> Callable[[str, Mapping[str, Any]], Incident | None]:
    """(summary, details) -> a new incident of `kind`: for the GPU event watch (`gpu_xid`),
    which sits in the run loop, below this module."""
    return lambda summary, details: Incident.create(state_dir, kind, summary, details, keep=keep)


class Incident:
    """One incident file; `record_next` appends what happened afterwards and rewrites it."""

    def __init__(self, path: Path, data: dict[str, Any], clock: Clock) -> None:
        self.path = path
        self.data = data
        self.clock = clock
        self._lock = threading.Lock()

    @classmethod
    def create(
        cls,
        state_dir: Path,
        kind: str,
        summary: str,
        details: Mapping[str, Any],
        clock: Clock | None = None,
        keep: int = KEEP_FILES,
    ) -> Incident | None:
        """Write a new incident (and keep only the `keep` newest); None (logged) when the state
        directory is not writable."""
        clock = clock or SystemClock()
        now = clock.wall()
        stamp = utc(now, "%Y%m%dT%H%M%SZ")
        data: dict[str, Any] = {
            "kind": kind,
            "summary": summary,
            "created_at": utc(now),
            **details,
            "next": [],
        }
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(
                dir=state_dir, prefix=f"incident-{stamp}-{kind}-", suffix=".json"
            )
            os.close(fd)
            incident = cls(Path(name), data, clock)
            incident._write()
        except OSError as exc:
            log.error("incident_not_written", kind=kind, summary=summary, error=str(exc))
            return None
        log.warning("incident_written", kind=kind, summary=summary, path=str(incident.path))
        removed = prune(state_dir, "incident-*.json", keep)
        if removed:
            log.info("incidents_pruned", removed=len(removed), kept=keep)
        return incident

    def record_next(self, step: str, **data: Any) -> None:
        """Append a later step (`tree_gone`, `gpu_release`, `relaunch`, ...) with its data."""
        with self._lock:
            entry = {"step": step, "at": utc(self.clock.wall())}
            self.data["next"].append({**entry, **data})
            try:
                self._write()
            except OSError as exc:
                log.error("incident_not_updated", path=str(self.path), error=str(exc))

    def _write(self) -> None:
        text = json.dumps(scrub(self.data), indent=2, default=str)  # no secret reaches the file
        write_text_atomic(self.path, text + "\n")
