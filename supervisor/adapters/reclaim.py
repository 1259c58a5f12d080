"""Kill single processes and hand their memory back fast: pidfd_open + process_mrelease.

Best effort: process_mrelease (syscall 448, Linux >= 5.15) frees a SIGKILLed process's anonymous
memory without waiting for its exit path, which can sit in D state for tens of seconds while the
kernel unpins (sglang PR #32829). It does not free VRAM. Failures are reported, never raised.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
from collections.abc import Iterable

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
