"""The host's processes for the run loop (implements core.ports.Processes): marks read from
/proc, SIGKILL through a pidfd with process_mrelease, reaping our own children and every
orphan the kernel hands us (as the tree's subreaper or a container's PID 1)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from supervisor.adapters import reclaim
from supervisor.adapters.procfs import ProcReader
from supervisor.core.ownership import ProcessMarks

# Children a Popen of ours waits for (the server's main process, the NVML worker): the orphan
# reaper collects them through their Popen, which keeps the exit status (one stolen by a bare
# waitpid reads as exit 0). A Popen and its registration happen under _SPAWNING, so a child
# that exits at once is never taken for an orphan in between.
_OWNED: dict[int, subprocess.Popen[Any]] = {}
_SPAWNING = threading.Lock()
_libc = ctypes.CDLL(None, use_errno=True)
_SIG_DFL = 0


def default_signal_dispositions() -> None:
    """Every signal back to its default action, none blocked: as systemd starts a service. An
    ignored signal survives exec, so a supervisor started from a background shell (SIGINT and
    SIGQUIT ignored) or one that ignores SIGUSR2 itself would hand that on to SGLang, whose
    ranks then never see the KeyboardInterrupt or the signal their handlers expect."""
    # libc's signal(), not Python's: this runs between fork and exec, maybe off the main thread.
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            _libc.signal(ctypes.c_int(signum), ctypes.c_void_p(_SIG_DFL))
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Hold around `Popen(...)` + `own_child(pid)` when other threads may reap."""
    with _SPAWNING:
        yield


# A bound on one call's work: a fork bomb of exiting orphans must not stall the run loop.
_MAX_REAPED_PER_CALL = 1000


def own_child(popen: subprocess.Popen[Any]) -> None:
    _OWNED[popen.pid] = popen


def disown_child(pid: int) -> None:
    _OWNED.pop(pid, None)


class SystemProcesses:
    """Real processes under `proc_root` (the signals go to real PIDs: tests use a fake)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.reader = ProcReader(proc_root)
        self._mark: str | None = None

    @property
    def self_pid(self) -> int:
        return os.getpid()

    def marks(self, pid: int) -> ProcessMarks | None:
        return self.reader.marks(pid)

    def scan(self) -> tuple[ProcessMarks, ...]:
        return self.reader.scan_marks()

    def kill(self, pid: int) -> bool:
        return reclaim.kill_and_reclaim(pid)

    def reap(self, pids: Sequence[int]) -> None:
        for pid in pids:
            # Not our child, or already reaped: nothing to collect.
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def reap_orphans(self) -> list[int]:
        """Reap the zombies the kernel reparents to us that no Popen of ours waits for: as the
        server tree's subreaper, its double-forked escapees; as a container's PID 1, every
        orphan of the container. Nobody else will, and each zombie holds a PID.

        waitid(WNOWAIT) names a zombie child without reaping it, so no /proc scan is needed
        (a container's /proc may not even be its own); an owned zombie is collected through
        its Popen, which keeps its status for its owner."""
        with _SPAWNING:
            return _reap_unowned()

    def oom_kill_count(self) -> int | None:
        return self.reader.oom_kill_count()

    def self_mark(self) -> str:
        if self._mark is None:
            self._mark = self.reader.supervisor_mark()
        return self._mark


def _reap_unowned() -> list[int]:
    reaped: list[int] = []
    for _ in range(_MAX_REAPED_PER_CALL):
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # no children at all
            break
        if found is None:
            break
        owner = _OWNED.get(found.si_pid)
        if owner is not None:
            if owner.poll() is None:  # another thread is waiting on it right now: it reaps
                break
            disown_child(found.si_pid)
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(found.si_pid, os.WNOHANG)
        reaped.append(found.si_pid)
    return reaped
