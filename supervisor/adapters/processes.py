"""The host's processes for the run loop (implements core.ports.Processes): marks read from
/proc, SIGKILL through a pidfd with process_mrelease, reaping our own children."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from supervisor.adapters import reclaim
from supervisor.adapters.procfs import ProcReader
from supervisor.core.ownership import ProcessMarks


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

    def oom_kill_count(self) -> int | None:
        return self.reader.oom_kill_count()

    def self_mark(self) -> str:
        if self._mark is None:
            self._mark = self.reader.supervisor_mark()
        return self._mark
