"""`sglang-supervisor status`: what an instance's supervisor is doing, alive or not.

Read from its state directory, never by signalling it: status.json (published by the live
`run`, adapters/status_file.py), state.json (what survives it: restart history, the watchdog's
override, the last failure) and the incident files. Alive = the PID in status.json with its
start time still runs; when status.json cannot tell, the directory's lock is tried.

Exit codes: 0 ready, 3 not running, 4 running but not ready, 2 bad input.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.status_file import (
    STATUS_FILE,
    is_running,
    lock_held,
    read_json,
    read_status,
    recorded_pid,
)
from supervisor.commands.instance import instance_options, state_dir_for
from supervisor.core.bounded import clip_line
from supervisor.core.status import Status, restarts_in_window
from supervisor.core.units import format_seconds
from supervisor.run.state import LOCK_FILE, STATE_FILE

READY, NOT_RUNNING, NOT_READY = 0, 3, 4
INCIDENTS_SHOWN = 5


@dataclass(frozen=True, slots=True)
class Found:
    """What the state directory holds."""

    directory: Path
    status: Status | None
    problem: str | None  # why status.json could not be read
    state: dict[str, Any]  # state.json as read; {} when absent or unreadable
    state_problem: str | None  # why state.json could not be read (damaged, unreadable)
    running: bool
    supervisor_pid: int | None
    incidents: list[dict[str, Any]]


def _alive(directory: Path, status: Status | None) -> tuple[bool, int | None]:
    """(whether the supervisor runs, its PID when it does)."""
    lock = directory / LOCK_FILE
    if status is not None and status.supervisor_start_ticks is not None:
        if is_running(status.supervisor_pid, status.supervisor_start_ticks):
            return True, status.supervisor_pid
        # Gone, unless a newer supervisor claimed the directory (its PID is in the lock file)
        # and has not published yet: only then is the lock itself tried.
        if recorded_pid(lock) in (None, status.supervisor_pid):
            return False, None
    held = lock_held(lock)
    return held, recorded_pid(lock) if held else None


def _incidents(directory: Path, count: int) -> list[dict[str, Any]]:
    """The newest `count` incident files, newest first (their names begin with a UTC time)."""
    paths = sorted(directory.glob("incident-*.json"), key=lambda p: p.name, reverse=True)
    out: list[dict[str, Any]] = []
    for path in paths[:count]:
        try:
            data = read_json(path)
        except (OSError, ValueError) as exc:
            out.append({"file": str(path), "problem": f"unreadable: {exc}"})
            continue
        if not isinstance(data, dict):
            data = {}
        out.append(
            {
                "at": data.get("created_at"),
                "kind": data.get("kind"),
                "summary": data.get("summary"),
                "file": str(path),
            }
        )
    return out


def _state_json(directory: Path) -> tuple[dict[str, Any], str | None]:
    """state.json as read, and what is wrong with it: a damaged one is said to be, not read as
    "no restarts" (`run` sets it aside at its next start)."""
    path = directory / STATE_FILE
    try:
        data = read_json(path)
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"{path} is unreadable ({exc.strerror or exc}): restart history unknown"
    except ValueError as exc:
        why = clip_line(str(exc), 200)
        return {}, f"{path} is damaged ({why}): restart history unknown; the next run sets it aside"
    if not isinstance(data, dict):
        return {}, f"{path} is damaged (not a JSON object): restart history unknown"
    return data, None


def inspect(directory: Path) -> Found | None:
    """What `directory` tells; None when no supervisor ever ran there."""
    status_path, state_path = directory / STATUS_FILE, directory / STATE_FILE
    if not status_path.exists() and not state_path.exists():
        return None
    status, problem = read_status(status_path)
    running, pid = _alive(directory, status)
    if running and status is not None and pid != status.supervisor_pid:
        problem = (
            f"{status_path} is an earlier supervisor's (pid {status.supervisor_pid}); "
            f"the running one (pid {pid}) has not published its status yet"
        )
        status = None
    state, state_problem = _state_json(directory)
    return Found(
        directory=directory,
        status=status,
        problem=problem,
        state=state,
        state_problem=state_problem,
        running=running,
        supervisor_pid=pid,
        incidents=_incidents(directory, INCIDENTS_SHOWN),
    )


def report(found: Found, now_s: float) -> dict[str, Any]:
    """The `--json` object (README "status"): status.json's fields, completed by state.json."""
    status, state = found.status, found.state
    out: dict[str, Any] = status.to_json() if status is not None else {}
    for internal in ("version", "supervisor_start_ticks", "restart_times"):
        out.pop(internal, None)
    out.update(
        running=found.running,
        supervisor_pid=found.supervisor_pid,
        state_dir=str(found.directory),
        problem=found.problem,
        state_problem=found.state_problem,
        incidents=found.incidents,
    )
    out.setdefault("instance", state.get("instance") or found.directory.name)
    out.setdefault("state", None)
    out["state_for_s"] = round(now_s - status.state_since_s, 1) if status is not None else None
    out["restart_count"] = status.restart_count if status else state.get("restart_count", 0)
    if status is None and found.state_problem is not None:
        out["restart_count"] = None  # unknown, not 0: the file that counts them is damaged
    out["restarts_in_window"] = _in_window(status, state, now_s)
    if status is not None and status.load is not None:
        eta = status.load.eta_s(now_s)
        out["load_progress"].update(
            eta_s=None if eta is None else round(eta), description=status.load.describe(now_s)
        )
    if not out.get("hicache_override") and state.get("hicache_size_override_gb") is not None:
        out["hicache_override"] = {
            "size_gb": state.get("hicache_size_override_gb"),
            "source": "restart_smaller",
            "reason": state.get("override_reason") or "",
        }
    if not out.get("last_failure") and state.get("last_failure"):
        out["last_failure"] = {
            "kind": state.get("last_failure"),
            "hint": state.get("last_failure_hint") or "",
            "at": state.get("last_failure_at"),
        }
    return out


def _in_window(status: Status | None, state: dict[str, Any], now_s: float) -> int | None:
    """Restarts within the restart window: state.json's history (it outlives a supervisor)."""
    if status is None:
        return None
    kept = state.get("restart_times")
    times = status.restart_times_s
    if isinstance(kept, list) and all(isinstance(t, int | float) for t in kept):
        times = tuple(float(t) for t in kept)
    return restarts_in_window(times, status.restart_window_s, now_s)


def exit_code(found: Found) -> int:
    if not found.running:
        return NOT_RUNNING
    ready = found.status is not None and found.status.state == "ready"
    return READY if ready else NOT_READY


# -- the human block ----------------------------------------------------------------------


def _utc(epoch_s: object) -> str:
    if not isinstance(epoch_s, int | float):
        return "?"
    moment = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _ago(epoch_s: object, now_s: float) -> str:
    if not isinstance(epoch_s, int | float):
        return "?"
    return f"{format_seconds(max(0.0, now_s - epoch_s))} ago"


def _headline(out: dict[str, Any], now_s: float) -> str:
    name, state = out["instance"], out.get("state")
    if out["running"]:
        where = f"{state} for {format_seconds(out['state_for_s'])}" if state else "state unknown"
        return f"{name}: running, {where}"
    if state is None:
        return f"{name}: not running"
    since = f" since {_utc(out.get('state_since'))}" if state != "failed" else ""
    return f"{name}: not running (last known state: {state}{since})"


def _rows(out: dict[str, Any], now_s: float) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if out.get("problem"):
        rows.append(("status file", out["problem"]))
    if out.get("state_problem"):
        rows.append(("state file", out["state_problem"]))
    if out.get("state") == "failed":
        rows.append(("ended", f"exit {out.get('exit_code')}: {out.get('end_reason')}"))
    if out.get("backoff_until") and out.get("state") == "backoff" and out["running"]:
        rows.append(("next launch", f"in {format_seconds(max(0, out['backoff_until'] - now_s))}"))
    progress = out.get("load_progress")
    if progress and out.get("state") in ("launching", "loading", "warming"):
        rows.append(("progress", progress["description"]))
    elif progress and progress["phase"] == "ready":
        took = format_seconds(progress["phase_since"] - progress["started_at"])
        rows.append(("last load", f"{took}, ready {_ago(progress['phase_since'], now_s)}"))
    if out.get("supervisor_pid"):
        rows.append(("supervisor", f"pid {out['supervisor_pid']}"))
    if out.get("server_pid"):
        rows.append(("server", f"pid {out['server_pid']}, run {out.get('run_id')}"))
    if out.get("argv"):
        rows.append(("argv", " ".join(out["argv"])))
    rows += _hicache_rows(out)
    rows.append(("restarts", _restarts(out)))
    failure = out.get("last_failure")
    if failure:
        when = _ago(failure.get("at"), now_s)
        rows.append(("last failure", f"{failure.get('kind')} ({when}): {failure.get('hint')}"))
    release = out.get("gpu_release")
    if release:
        rows.append(("GPU release", f"{release['state']} {release['detail']}".strip()))
    if out.get("gpu_health"):
        rows.append(("GPU health", _gpu_health(out["gpu_health"])))
    if out.get("gpu_xids"):  # {"1": {"79": 1}}: "GPU 1: Xid 79 ×1"
        per_gpu = sorted(out["gpu_xids"].items(), key=lambda item: int(item[0]))
        counts = [(g, ", ".join(f"Xid {x} ×{n}" for x, n in xids.items())) for g, xids in per_gpu]
        rows.append(("GPU Xids", "; ".join(f"GPU {g}: {text}" for g, text in counts)))
    for i, incident in enumerate(out["incidents"]):
        line = incident.get("problem") or (
            f"{incident.get('at')}  {incident.get('kind')}  {incident.get('summary')}"
        )
        rows.append(("incidents" if i == 0 else "", line))
    if out.get("updated_at"):
        rows.append(("updated", _ago(out["updated_at"], now_s)))
    return rows


def _gpu_health(lines: dict[str, dict[str, str]]) -> str:
    """The last health gate: "GPU 0 ok; GPU 1 fail (a row remap is pending: ...)"."""
    shown = []
    for gpu, line in sorted(lines.items(), key=lambda item: (len(item[0]), item[0])):
        reason = f" ({line['reason']})" if line.get("reason") else ""
        shown.append(f"GPU {gpu} {line.get('verdict')}{reason}")
    return "; ".join(shown)


def _hicache_rows(out: dict[str, Any]) -> list[tuple[str, str]]:
    override = out.get("hicache_override")
    size = out.get("hicache_size_gb")
    if not override:
        return [("hicache size", f"{size} GB")] if size else []
    text = f"{override.get('size_gb')} GB, {override.get('source')}: {override.get('reason')}"
    if override.get("source") == "restart_smaller":
        text += " (`sglang-supervisor reset-state` clears it)"
    return [("hicache size", text)]


def _restarts(out: dict[str, Any]) -> str:
    if out.get("restart_count", 0) is None:
        return "unknown (the state file is damaged)"
    text = str(out.get("restart_count", 0))
    window_s, count = out.get("restart_window_s"), out.get("restarts_in_window")
    if window_s and count is not None:
        text = f"{count} in the last {format_seconds(window_s)} ({text} in all)"
    return text


def render(out: dict[str, Any], now_s: float) -> str:
    """A compact aligned block."""
    rows = _rows(out, now_s)
    width = max((len(key) for key, _ in rows), default=0)
    lines = [_headline(out, now_s)]
    lines += [f"  {key:<{width}}  {value}" for key, value in rows]
    return "\n".join(lines)


@click.command("status")
@instance_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object (docs/operating.md).")
def status_command(
    config_path: Path | None, state_dir: Path | None, name: str | None, as_json: bool
) -> int:
    """What the supervisor of an instance is doing, whether it runs or not.

    \b
    Exit codes: 0 ready, 3 not running, 4 running but not ready, 2 bad input.
    """
    directory = state_dir_for(config_path, state_dir, name)
    now_s = SystemClock().wall()
    found = inspect(directory)
    if found is None:
        message = (
            f"no supervisor state in {directory}"
            if state_dir is not None and name is None
            else f"no supervisor state for {name or directory.name} (nothing in {directory})"
        )
        if as_json:
            click.echo(json.dumps({"running": False, "state": None, "problem": message}))
        click.echo(f"sglang-supervisor: {message}", err=True)
        return NOT_RUNNING
    out = report(found, now_s)
    click.echo(json.dumps(out, sort_keys=True) if as_json else render(out, now_s))
    return exit_code(found)
