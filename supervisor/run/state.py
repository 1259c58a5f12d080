"""The run state file: one JSON document per instance in state_dir, written atomically.

Holds what must survive a restart of the supervisor or the machine: restart count, last failure
class, PIDs of the current run (to find leftovers), target GPUs, and the watchdog's
`--hicache-size` override. A corrupt file is kept aside as `.corrupt-<ts>` and a fresh state used.
Never holds secrets.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from supervisor.adapters.clock import SystemClock
from supervisor.atomic_file import write_text_atomic
from supervisor.config.sections import STATE_ROOT
from supervisor.core.ports import Clock
from supervisor.errors import ConfigError

log = structlog.get_logger("supervisor.state")

STATE_FILE = "state.json"
LOCK_FILE = "supervisor.lock"
_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcessRef:
    """A process of a run: the PID plus its start time (clock ticks), so a reused PID never
    matches."""

    pid: int
    start_ticks: int
    title: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunState:
    instance: str = ""
    run_id: str = ""
    supervisor_pid: int | None = None
    restart_count: int = 0
    last_failure: str | None = None  # a FailureKind value
    last_failure_hint: str | None = None
    last_failure_at: float | None = None  # seconds since the epoch
    server_pids: tuple[ProcessRef, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    # Set by the watchdog after a memory kill; applied as --hicache-size at the next launch and
    # kept until `sglang-supervisor reset-state`.
    hicache_size_override_gb: int | None = None
    override_reason: str | None = None
    updated_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["version"] = _VERSION
        return data

    @classmethod
    def from_json(cls, data: Any) -> RunState:
        """Raises ValueError/TypeError/KeyError on a document that is not a state file."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["server_pids"] = tuple(
            ProcessRef(pid=int(p["pid"]), start_ticks=int(p["start_ticks"]), title=str(p["title"]))
            for p in values.get("server_pids", ())
        )
        values["gpu_indices"] = tuple(int(i) for i in values.get("gpu_indices", ()))
        override = values.get("hicache_size_override_gb")
        if override is not None and (not isinstance(override, int) or override < 0):
            raise ValueError(f"hicache_size_override_gb {override!r} is not a size in GB")
        return cls(**values)


def default_state_dir(instance: str) -> Path:
    return STATE_ROOT / instance


class StateStore:
    """Reads and atomically rewrites the state file; `update` is safe across threads."""

    def __init__(self, state_dir: Path, clock: Clock | None = None) -> None:
        self.dir = state_dir
        self.clock = clock or SystemClock()
        self.path = state_dir / STATE_FILE
        self._lock = threading.Lock()
        self._lock_fd: int | None = None

    def ensure_writable(self) -> None:
        """Create the directory and prove it is writable, before anything starts.

        Raises:
            ConfigError: it cannot be created or written (permissions, read-only file system).
        """
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".probe-"):
                pass
        except OSError as exc:
            raise ConfigError(
                f"state directory {self.dir} is not writable: {exc.strerror or exc} "
                "(set run.state_dir or --state-dir)"
            ) from None

    def claim(self) -> None:
        """Hold an exclusive lock on the state directory for the life of this process.

        A second supervisor of the same instance would take the first one's server for leftovers
        of an earlier run and kill it (a manual `run` beside the systemd unit, say).

        Raises:
            ConfigError: another live supervisor holds the lock (its PID is named).
        """
        path = self.dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ConfigError(
                f"another sglang-supervisor (pid {holder}) already supervises the state "
                f"directory {self.dir}; stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # Kept open on purpose: the kernel drops the lock when this process exits, however.
        self._lock_fd = fd

    def load(self) -> RunState:
        """The stored state; a fresh one when there is none or it is corrupt (kept aside)."""
        with self._lock:
            return self._load()

    def _load(self) -> RunState:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return RunState()
        except OSError as exc:
            log.warning("state_unreadable", path=str(self.path), error=str(exc))
            return RunState()
        try:
            return RunState.from_json(json.loads(text))
        except (ValueError, TypeError, KeyError) as exc:
            kept = self.path.with_name(f"{STATE_FILE}.corrupt-{int(self.clock.wall())}")
            try:
                os.replace(self.path, kept)
            except OSError:
                kept = self.path
            log.warning(
                "state_corrupt",
                path=str(self.path),
                kept_as=str(kept),
                error=str(exc),
                action="starting with a fresh state",
            )
            return RunState()

    def save(self, state: RunState) -> None:
        with self._lock:
            self._save(state)

    def _save(self, state: RunState) -> None:
        state = dataclasses.replace(state, updated_at=self.clock.wall())
        payload = json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n"
        write_text_atomic(self.path, payload)

    def update(self, change: Callable[[RunState], RunState]) -> RunState:
        """Read-modify-write under the store's lock (the runner and the watchdog both write)."""
        with self._lock:
            new = change(self._load())
            self._save(new)
            return new
