"""The run state file: one JSON document per instance in state_dir, written atomically.

Holds what must survive a restart of the supervisor or the machine: restart count and the times
of the restarts in the budget's window, last failure class, PIDs of the current run (to find
leftovers), target GPUs, and the watchdog's `--hicache-size` override. A corrupt file is kept
aside as `.corrupt-<ts>` and a fresh state used.
Never holds secrets.

Root writes here, so the directory is checked before anything is opened in it
(supervisor/adapters/private_dir.py: ours, not writable by others, on a path only root or we
can change), created 0700 when missing, and every file in it is 0600 and opened without
following a symbolic link (the lock with O_NOFOLLOW, the state through supervisor/atomic_file.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.private_dir import UnsafeDirectory, private_dir
from supervisor.atomic_file import PRIVATE_FILE_MODE, open_regular, write_text_atomic
from supervisor.config.sections import STATE_ROOT
from supervisor.core.bounded import parse_json
from supervisor.core.ports import Clock
from supervisor.errors import ConfigError
from supervisor.log import scrub

log = structlog.get_logger("supervisor.state")

STATE_FILE = "state.json"
LOCK_FILE = "supervisor.lock"
# Kept of each kind of file that piles up in a state directory (incident reports, corrupt state
# files set aside): the newest, so a flapping box cannot fill its disk with them.
KEEP_FILES = 100
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
    # When the restarts of the budget's window happened, in seconds since the epoch: a
    # supervisor started again (by systemd, after a crash loop) goes on with the same budget.
    restart_times: tuple[float, ...] = ()
    last_failure: str | None = None  # a FailureKind value
    last_failure_hint: str | None = None
    last_failure_at: float | None = None  # seconds since the epoch
    server_pids: tuple[ProcessRef, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    # Set by the watchdog after a memory kill; applied as --hicache-size at the next launch and
    # kept until `sglang-supervisor reset-state`.
    hicache_size_override_gb: int | None = None
    override_reason: str | None = None
    override_set_at: float | None = None  # seconds since the epoch ([watchdog] shrink_expires)
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
        values["restart_times"] = tuple(_epoch_s(t) for t in values.get("restart_times", ()))
        override = values.get("hicache_size_override_gb")
        if override is not None and (not isinstance(override, int) or override < 0):
            raise ValueError(f"hicache_size_override_gb {override!r} is not a size in GB")
        set_at = values.get("override_set_at")
        if set_at is not None and (isinstance(set_at, bool) or not isinstance(set_at, int | float)):
            raise ValueError(f"override_set_at {set_at!r} is not seconds since the epoch")
        return cls(**values)


def _epoch_s(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"restart time {value!r} is not seconds since the epoch")
    return float(value)


def prune(directory: Path, pattern: str, keep: int) -> list[Path]:
    """Remove all but the `keep` newest files matching `pattern` (by name: they carry a UTC
    time); returns what was removed. A file that cannot go is left, never an error."""
    found = sorted(directory.glob(pattern), key=lambda p: p.name)
    removed = []
    for path in found[: max(0, len(found) - keep)]:
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def default_state_dir(instance: str) -> Path:
    return STATE_ROOT / instance


class StateStore:
    """Reads and atomically rewrites the state file; `update` is safe across threads."""

    def __init__(
        self, state_dir: Path, clock: Clock | None = None, keep_files: int = KEEP_FILES
    ) -> None:
        self.dir = state_dir
        self.clock = clock or SystemClock()
        self.path = state_dir / STATE_FILE
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._unsaved: RunState | None = None
        self.keep_files = keep_files

    def ensure_writable(self) -> None:
        """Create the directory (0700) or accept it, check that no other user can change what
        is in it, and prove it is writable, before anything starts.

        Raises:
            ConfigError: it is another user's, writable by others, not a directory (a file, a
                dangling link, a loop of links), or cannot be created or written (permissions, a
                read-only file system).
        """
        try:
            private_dir(self.dir)
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".probe-"):
                pass
        except UnsafeDirectory as exc:
            raise ConfigError(f"state directory {self.dir} {exc}") from None
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
            ConfigError: another live supervisor holds the lock (its PID is named), or the lock
                file is a symbolic link or not a regular file (never followed, never truncated).
        """
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ConfigError(
                f"another sglang-supervisor (pid {holder}) already supervises the state "
                f"directory {self.dir}; stop it first"
            ) from None
        # The PID only names the holder in the message above: a full disk must not stop a start.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # Kept open on purpose: the kernel drops the lock when this process exits, however.
        self._lock_fd = fd

    def _open_lock(self) -> int:
        path = self.dir / LOCK_FILE
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, PRIVATE_FILE_MODE)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link: planted, or left by hand
                raise ConfigError(
                    f"{path} is a symbolic link; the supervisor never follows one in its state "
                    "directory (remove it)"
                ) from None
            raise ConfigError(
                f"state directory {self.dir}: cannot open {LOCK_FILE}: {exc.strerror or exc}"
            ) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ConfigError(f"{path} is not a regular file; remove it")
        if stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE:  # an earlier release made it 0644
            with contextlib.suppress(OSError):
                os.fchmod(fd, PRIVATE_FILE_MODE)
        return fd

    def release(self) -> None:
        """Give up the lock `claim` took (a short-lived holder: `reset-state`); no-op without."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the last descriptor drops the flock
            self._lock_fd = None

    def load(self) -> RunState:
        """The stored state; a fresh one when there is none or it is corrupt (kept aside)."""
        with self._lock:
            return self._load()

    def _load(self) -> RunState:
        if self._unsaved is not None:  # the disk refused the last write: memory is newer
            return self._unsaved
        try:
            raw = _read_regular(self.path)
        except FileNotFoundError:
            return RunState()
        except OSError as exc:
            log.warning("state_unreadable", path=str(self.path), error=str(exc))
            return RunState()
        try:  # non-UTF-8 bytes are as corrupt as bad JSON (UnicodeDecodeError is a ValueError)
            return RunState.from_json(parse_json(raw.decode("utf-8")))
        except (ValueError, TypeError, KeyError) as exc:
            kept = self.path.with_name(f"{STATE_FILE}.corrupt-{int(self.clock.wall())}")
            try:
                os.replace(self.path, kept)
                prune(self.dir, f"{STATE_FILE}.corrupt-*", self.keep_files)
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

    def _save(self, state: RunState, *, sync: bool = True) -> None:
        """Write the state; a full or failing disk keeps it in memory (and says so once) rather
        than ending a run that is serving: the next change tries again."""
        state = dataclasses.replace(state, updated_at=self.clock.wall())
        payload = json.dumps(scrub(state.to_json()), indent=2, sort_keys=True) + "\n"
        try:
            write_text_atomic(self.path, payload, sync=sync)
        except OSError as exc:
            if self._unsaved is None:
                log.error(
                    "state_not_saved",
                    path=str(self.path),
                    error=exc.strerror or str(exc),
                    action="kept in memory; written again at the next change",
                )
            self._unsaved = state
            return
        if self._unsaved is not None:
            log.info("state_saved_again", path=str(self.path))
        self._unsaved = None

    def update(self, change: Callable[[RunState], RunState]) -> RunState:
        """Read-modify-write under the store's lock (the runner and the watchdog both write)."""
        with self._lock:
            new = change(self._load())
            self._save(new)
            return new

    def try_update(
        self, change: Callable[[RunState], RunState], *, wait_s: float, sync: bool = True
    ) -> RunState | None:
        """`update` for a caller that must not wait: None when the lock is not free within
        `wait_s` (another thread is writing). `sync=False` skips the fsyncs (see
        write_text_atomic): the new file survives the death of this process at once, a power
        cut only after the next synced write. The memory watchdog writes its shrink this way
        right before a SIGKILL."""
        if not self._lock.acquire(timeout=wait_s):
            return None
        try:
            new = change(self._load())
            self._save(new, sync=sync)
            return new
        finally:
            self._lock.release()


def _read_regular(path: Path) -> bytes:
    """The file's bytes; OSError for anything but a regular file (a start must never hang on
    its state file) and for a symbolic link (never followed: the next save replaces it)."""
    with open_regular(path, follow_symlinks=False) as f:
        return f.read()
