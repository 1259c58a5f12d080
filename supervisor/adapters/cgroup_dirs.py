"""The directories of the server's cgroups: who is in one, and removing them once empty
(split from adapters/cgroup.py, which makes and reads the groups)."""

from __future__ import annotations

import errno
import time
from collections.abc import Iterable
from pathlib import Path


def pids_in(group: Path) -> list[int]:
    """The processes in `group` (its cgroup.procs); [] when it is gone."""
    try:
        text = (group / "cgroup.procs").read_text(encoding="ascii")
    except OSError:
        return []
    return [int(line) for line in text.split() if line.isdigit()]


# A killed task leaves v2's `populated` before every hierarchy: its v1 memory group (a hybrid
# host) may refuse rmdir with EBUSY a moment longer (about 1 kill in 10 under load, here).
_RMDIR_BUSY_WAIT_S = 5.0
_RMDIR_RETRY_S = 0.01


def rmdir_group(path: Path, busy_wait_s: float = _RMDIR_BUSY_WAIT_S) -> None:
    """rmdir an emptied group, retrying while the kernel still calls it busy (bounded); a group
    already gone is fine.

    Raises:
        OSError: it is still busy after `busy_wait_s` (a live member), or another refusal.
    """
    deadline = time.monotonic() + busy_wait_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline or pids_in(path):
                raise
        time.sleep(_RMDIR_RETRY_S)


def subdirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def existing_dirs(paths: Iterable[Path | None]) -> list[Path]:
    return [p for p in paths if p is not None and p.is_dir()]
