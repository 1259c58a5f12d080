"""/dev/shm for the run loop: list SGLang's segments, remove those a dead tree of ours left (the
rule is core.shm's), and see which files live processes still hold (open or mapped)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import structlog

from supervisor.adapters.procfs import ProcReader
from supervisor.core.shm import Member, Segment, is_candidate, is_unstamped, left_by

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
    """The segments of SGLang's families in `directory` (unreadable entries skipped)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return ()
    out = []
    for entry in entries:
        if not is_candidate(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        out.append(
            Segment(name=entry.name, size_bytes=st.st_size, made_at_s=min(st.st_mtime, st.st_ctime))
        )
    return tuple(out)


def held_by_anyone(
    names: Iterable[str], directory: Path = SHM_DIR, proc_root: Path = Path("/proc")
) -> Callable[[str], bool]:
    """Whether a live process holds each of `names` in `directory`: open (/proc/PID/fd) or
    mapped (/proc/PID/maps), compared by device and inode (glibc's sem_open maps a temporary
    file it then links under the semaphore's name: maps shows "sem.XXXXXX (deleted)").

    A process whose files cannot be read may hold any file its user could open: the owner's
    (SGLang and Python make them 0600), or any with group or other access. Root reads every
    dumpable process; what it cannot read is non-dumpable (a sandbox's init, a setuid program,
    an agent), never an SGLang or multiprocessing process, so as root the unreadable are no
    holders."""
    files: dict[tuple[int, int], str] = {}
    for name in names:
        with contextlib.suppress(OSError):
            st = (directory / name).stat()
            files[(st.st_dev, st.st_ino)] = name
    if not files:
        return lambda _name: False
    held: set[str] = set()
    unreadable_uids: set[int] = set()
    for pid_dir in _pid_dirs(proc_root):
        found = _held_by(pid_dir, files)
        if found is None:
            if os.geteuid() == 0:
                continue
            with contextlib.suppress(OSError):
                unreadable_uids.add(pid_dir.stat().st_uid)
        else:
            held |= found

    def is_held(name: str) -> bool:
        if name in held:
            return True
        try:
            st = (directory / name).stat()
        except OSError:
            return True  # gone or unreadable: nothing to remove
        others_may_open = bool(unreadable_uids) and bool(st.st_mode & 0o077)
        return st.st_uid in unreadable_uids or others_may_open

    return is_held


def _pid_dirs(proc_root: Path) -> list[Path]:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return [proc_root / n for n in names if n.isdigit() and int(n) != os.getpid()]


def _held_by(pid_dir: Path, files: Mapping[tuple[int, int], str]) -> set[str] | None:
    """The files (by device and inode) this process maps or has open; None when it cannot be
    read (a process gone meanwhile holds nothing)."""
    found: set[str] = set()
    try:
        maps = (pid_dir / "maps").read_text(encoding="utf-8", errors="replace")
        fds = os.listdir(pid_dir / "fd")
    except FileNotFoundError:
        return found
    except OSError:
        return None if pid_dir.exists() else found
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev(major:minor hex) inode [path]
        if len(fields) == 6:
            found.update(_file_at(files, fields[3], fields[4]))
    for fd in fds:
        with contextlib.suppress(OSError):
            st = os.stat(pid_dir / "fd" / fd)
            if (name := files.get((st.st_dev, st.st_ino))) is not None:
                found.add(name)
    return found


def _file_at(files: Mapping[tuple[int, int], str], dev: str, inode: str) -> tuple[str, ...]:
    major, _, minor = dev.partition(":")
    try:
        key = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
    except ValueError:
        return ()
    name = files.get(key)
    return () if name is None else (name,)


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
    found = segments(directory)
    is_held = held_by_anyone((s.name for s in found if is_unstamped(s.name)), directory)
    stale = left_by(found, members, reader.is_running, _exists, is_held)
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
