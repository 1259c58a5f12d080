"""Kill single processes and hand their memory back fast: pidfd_open + process_mrelease; and
kill every process carrying a mark in its environment, through pidfds (no PID reuse hit).

Best effort: process_mrelease (syscall 448, Linux >= 5.15) frees a SIGKILLed process's anonymous
memory without waiting for its exit path, which can sit in D state for tens of seconds while the
kernel unpins (sglang PR #32829). It does not free VRAM. Failures are reported, never raised.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import time
from collections.abc import Callable, Iterable

from supervisor.adapters.procfs import ProcReader

# kill_marked: scan-and-kill rounds (a fork bomb is bounded, never a hang), and how long the
# killed get to be gone.
_SWEEP_ROUNDS = 10
KILL_WAIT_S = 5.0
# Same number on every architecture: syscalls added after 5.x use one shared table.
_SYS_PROCESS_MRELEASE = 448

_libc: ctypes.CDLL | None = None


def _syscall() -> ctypes.CDLL:
    global _libc  # one libc handle per process, loaded lazily
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (immune to PID reuse), or None when gone or unsupported (< 5.3)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    return fd


def process_mrelease(pidfd: int) -> bool:
    """Ask the kernel to reap the memory of a killed process now; False when not possible.

    EINVAL means the process is not dying yet (or has already exited), ENOSYS an older kernel.
    """
    try:
        rc = _syscall().syscall(_SYS_PROCESS_MRELEASE, ctypes.c_int(pidfd), ctypes.c_uint(0))
    except (AttributeError, OSError):
        return False
    return int(rc) == 0


def release_memory(pidfds: Iterable[int]) -> int:
    """process_mrelease every pidfd (after SIGKILL) and close them; returns how many succeeded."""
    done = 0
    for fd in pidfds:
        if process_mrelease(fd):
            done += 1
        with contextlib.suppress(OSError):
            os.close(fd)
    return done


def kill_and_reclaim(pid: int) -> bool:
    """SIGKILL one process through its pidfd, then process_mrelease it. False if already gone."""
    fd = open_pidfd(pid)
    try:
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        if fd is not None:
            os.close(fd)
        return False
    except OSError as exc:
        if fd is not None:
            os.close(fd)
        if exc.errno == errno.ESRCH:
            return False
        raise
    if fd is not None:
        release_memory([fd])
    return True


def kill_marked(proc: ProcReader, name: str, matches: Callable[[str], bool]) -> tuple[int, ...]:
    """SIGKILL every live process whose environment sets `name` to a value that `matches`,
    scanning again until a scan finds no new one (what was killed cannot fork any more); then
    wait until they are gone and reap those that are our children. Returns the PIDs killed.
    How the supervisor finds what escaped a process group: the marks every descendant
    inherits (adapters/command.py)."""
    pidfds: dict[int, int | None] = {}
    try:
        for _ in range(_SWEEP_ROUNDS):
            fresh = [p for p in proc.pids_marked(name, matches) if p not in pidfds]
            if not fresh:
                break
            for pid in fresh:
                pidfds[pid] = _kill_one(proc, pid, name, matches)
        _await_gone(fd for fd in pidfds.values() if fd is not None)
    finally:
        for fd in pidfds.values():
            if fd is not None:
                os.close(fd)
    return tuple(sorted(pidfds))


def _kill_one(proc: ProcReader, pid: int, name: str, matches: Callable[[str], bool]) -> int | None:
    """SIGKILL `pid` through a pidfd, after checking (through the pidfd's pinned process)
    that it still carries the mark: a PID reused since the scan is never hit."""
    fd = open_pidfd(pid)
    value = proc.environ_value(pid, name)
    if value is None or not matches(value):
        if fd is not None:
            os.close(fd)
        return None
    with contextlib.suppress(OSError):
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    return fd


def _await_gone(pidfds: Iterable[int], timeout_s: float = KILL_WAIT_S) -> None:
    """Wait (bounded) until each pidfd's process has exited; reap the ones that are our
    children (the subreaper's escapees), race-free through the pidfd."""
    deadline = time.monotonic() + timeout_s
    for fd in pidfds:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
