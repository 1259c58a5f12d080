"""/dev/shm for the run loop: list SGLang's pid-stamped segments, remove those a dead tree of
ours left (the rule is core.shm's)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import structlog

from supervisor.adapters.procfs import ProcReader
from supervisor.core.shm import Member, Segment, creator_pid, left_by

log = structlog.get_logger("supervisor.shm")

SHM_DIR = Path("/dev/shm")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def started_at_s(start_ticks: int) -> float:
    """A process's start as wall time (epoch seconds), never later than the real start.

    The start is counted in clock ticks of CLOCK_BOOTTIME; the offset between that clock and
    the wall clock is taken now, so a clock stepped since boot does not skew it (/proc/stat's
    btime would, and is truncated to whole seconds besides). Ticks are truncated: early side.
    """
    since_start_s = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / _CLK_TCK
    return time.time() - since_start_s


def segments(directory: Path = SHM_DIR) -> tuple[Segment, ...]:
    """SGLang's pid-stamped segments in `directory` (unreadable entries skipped)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return ()
    out = []
    for entry in entries:
        if creator_pid(entry.name) is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        out.append(
            Segment(name=entry.name, size_bytes=st.st_size, made_at_s=min(st.st_mtime, st.st_ctime))
        )
    return tuple(out)


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def sweep(
    seen: Mapping[int, int],
    *,
    proc: ProcReader | None = None,
    directory: Path = SHM_DIR,
) -> tuple[int, int]:
    """Remove the segments made by processes of `seen` (pid -> start ticks, a tree of ours
    that is gone now). Best effort, never raises. Returns (segments removed, bytes freed)."""
    if not seen:
        return 0, 0
    reader = proc or ProcReader()
    members = {
        pid: Member(pid=pid, start_ticks=ticks, started_at_s=started_at_s(ticks))
        for pid, ticks in seen.items()
        if ticks > 0
    }
    # A zombie is gone too: its segments are as orphaned as a reaped process's.
    stale = left_by(segments(directory), members, reader.is_running, _exists)
    removed = freed = 0
    for segment in stale:
        try:
            (directory / segment.name).unlink()
        except FileNotFoundError:
            continue  # its creator's resource tracker, or SGLang's sweep, was first
        except OSError as exc:
            log.warning("shm_not_removed", segment=segment.name, reason=exc.strerror or str(exc))
            continue
        removed += 1
        freed += segment.size_bytes
    if removed:
        log.warning("shm_removed", segments=removed, freed_bytes=freed, directory=str(directory))
    return removed, freed
