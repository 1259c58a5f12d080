"""/dev/shm for the run loop: list SGLang's pid-stamped segments, remove those a dead tree of
ours left (the rule is core.shm's)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import structlog

from supervisor.adapters.procfs import ProcReader
from supervisor.core.shm import Member, Segment, creator_pid, left_by

log = structlog.get_logger("supervisor.shm")

SHM_DIR = Path("/dev/shm")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def boot_time_s(proc_root: Path = Path("/proc")) -> float | None:
    """The boot time (epoch seconds, whole: /proc/stat's btime is truncated)."""
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


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


def sweep(
    seen: Mapping[int, int],
    *,
    proc: ProcReader | None = None,
    directory: Path = SHM_DIR,
) -> tuple[int, int]:
    """Remove the segments made by processes of `seen` (pid -> start ticks, a tree of ours
    that is gone now). Best effort, never raises. Returns (segments removed, bytes freed)."""
    boot_s = boot_time_s()
    if not seen or boot_s is None:
        return 0, 0
    reader = proc or ProcReader()
    members = {
        pid: Member(pid=pid, start_ticks=ticks, started_at_s=boot_s + ticks / _CLK_TCK)
        for pid, ticks in seen.items()
        if ticks > 0
    }
    stale = left_by(segments(directory), members, lambda p, t: reader.start_ticks(p) == t)
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
