"""status.json in the state directory: the live `run`'s status, folded from its log events
(core/status.py) and published atomically, so `sglang-supervisor status` reads it without ever
signalling the supervisor.

`feed` is a sink of the log's event tap: it runs in whatever thread logged, so it is locked,
quick, and never logs itself. The file is written at every change of state (or load phase) and
otherwise at most every `min_interval_s`; what a throttled event changed is written by `flush`,
which the supervisor calls every second. A failing disk only counts an error: a status file must
never stop or slow a run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from supervisor.adapters.procfs import ProcReader
from supervisor.atomic_file import open_regular, write_text_atomic
from supervisor.core.bounded import parse_json
from supervisor.core.status import Status, fold

STATUS_FILE = "status.json"
MIN_INTERVAL_S = 2.0
# The one file of the state directory a group may read: the operator who gives the directory a
# group (`chgrp ops DIR && chmod 2750 DIR`: new files then take that group) lets that group run
# `sglang-supervisor status` without root. It holds the fold of the log's events, secrets masked.
# Everything else there (state.json, incidents with their log tails, the lock) stays 0600.
STATUS_FILE_MODE = 0o640


class StatusPublisher:
    def __init__(
        self,
        state_dir: Path,
        *,
        instance: str,
        restart_window_s: float,
        min_interval_s: float = MIN_INTERVAL_S,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = state_dir / STATUS_FILE
        self.min_interval_s = min_interval_s
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        pid = os.getpid()
        self._status = Status.begin(
            instance=instance,
            supervisor_pid=pid,
            supervisor_start_ticks=ProcReader().start_ticks(pid),
            restart_window_s=restart_window_s,
            now_s=wall(),
        )
        self._written_key: tuple[object, ...] | None = None
        self._written_at = float("-inf")
        self._dirty = True
        self.errors = 0  # writes that failed (a full or read-only disk)

    def snapshot(self) -> Status:
        with self._lock:
            return self._status

    def feed(self, event: Mapping[str, Any]) -> None:
        """The log tap's sink: fold the event in; write now when the state changed.

        The fold (a server line's load progress is parsed there) runs before the lock is taken,
        on the status as it was: the output pump's thread never holds the lock that the
        watchdog's, the runner's and the load reporter's own events need while it parses a
        line. Folded again under the lock when another event came in between (a line that
        changed nothing of the status it saw is dropped: the next redraw tells the same).
        """
        now_s = self._wall()
        before = self._status
        new = fold(before, event, now_s)
        if new is before:
            return
        with self._lock:
            if self._status is not before:
                new = fold(self._status, event, now_s)
                if new is self._status:
                    return
            self._status, self._dirty = new, True
            changed = new.key() != self._written_key
            if changed or self._monotonic() - self._written_at >= self.min_interval_s:
                self._write()

    def flush(self) -> None:
        """Write what throttled events changed, once `min_interval_s` has passed since the last
        write (the first call writes at once)."""
        with self._lock:
            if self._dirty and self._monotonic() - self._written_at >= self.min_interval_s:
                self._write()

    def close(self) -> None:
        """The last word: whatever changed is written now."""
        with self._lock:
            if self._dirty:
                self._write()

    def locked(self, action: Callable[[Status], None]) -> None:
        """Run `action` on the current status with no event folded in meanwhile: what it sends
        (systemd's STATUS=) cannot overtake the runner's own message about a newer state."""
        with self._lock:
            action(self._status)

    def _write(self) -> None:
        status = self._status
        self._written_at = self._monotonic()
        self._written_key = status.key()
        self._dirty = False
        try:
            text = json.dumps(status.to_json(), indent=2) + "\n"
            write_text_atomic(self.path, text, mode=STATUS_FILE_MODE)
        except OSError:
            self.errors += 1
            self._dirty = True


# -- reading (`sglang-supervisor status`, another process) --------------------------------

MAX_FILE_BYTES = 8 << 20  # an incident file with its log tail is well below this


def read_json(path: Path, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The JSON document in `path`.

    Raises:
        FileNotFoundError: there is none.
        OSError: not a regular file, unreadable, or larger than `max_bytes`.
        ValueError: not UTF-8 JSON (the message says where), or nested too deep.
    """
    # Never a FIFO (`status` must not hang), never through a link (our files are ours).
    with open_regular(path, follow_symlinks=False) as f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
        raw = f.read(max_bytes + 1)
    return parse_json(raw.decode("utf-8"))  # nested past 64 levels: a ValueError too


def read_status(path: Path) -> tuple[Status | None, str | None]:
    """(the status, None), (None, None) when there is no file, or (None, what is wrong)."""
    try:
        return Status.from_json(read_json(path)), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror or exc}"
    except (ValueError, TypeError, KeyError) as exc:
        return None, f"{path} is corrupt ({type(exc).__name__}: {exc}); `run` rewrites it"


def recorded_pid(lock_path: Path) -> int | None:
    """The PID the last supervisor to claim the state directory wrote into its lock file."""
    try:
        with open_regular(lock_path, follow_symlinks=False) as f:
            text = os.pread(f.fileno(), 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock_held(lock_path: Path) -> bool:
    """Whether a live process holds the state directory's lock.

    The lock is tried shared and non-blocking and given back at once: a supervisor starting at
    that very moment could find it taken, so callers try it only when the status file cannot
    tell (supervisor/run/state.py claim() takes it exclusively for a supervisor's whole life).
    """
    try:
        with open_regular(lock_path, follow_symlinks=False) as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:  # missing, not a regular file, or no lock to take
        return False
    return False


def is_running(pid: int, start_ticks: int) -> bool:
    """That very process (PID and start time: not a reused PID) is alive."""
    return ProcReader().is_running(pid, start_ticks)
