"""A process table: marks to judge ownership, kills recorded."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from supervisor.core.ownership import ProcessMarks


@dataclasses.dataclass
class FakeProc:
    """One process in a FakeProcesses table."""

    pid: int
    title: str = "python"
    state: str = "S"
    start_ticks: int = 1000
    instance: str | None = None
    launched_by: str | None = None
    launcher_alive: bool = False
    survives_kill: bool = False  # a D-state process: SIGKILL stays pending

    def marks(self) -> ProcessMarks:
        return ProcessMarks(
            pid=self.pid,
            start_ticks=self.start_ticks,
            state=self.state,
            title=self.title,
            instance=self.instance,
            launched_by=self.launched_by,
            launcher_alive=self.launcher_alive,
        )


class FakeProcesses:
    """core.ports.Processes over a dict: kill removes a process unless it survives kills."""

    def __init__(self, procs: Iterable[FakeProc] = (), *, self_pid: int = 1) -> None:
        self.procs = {p.pid: p for p in procs}
        self._self_pid = self_pid
        self.killed: list[int] = []
        self.oom_kills: int | None = 0

    @property
    def self_pid(self) -> int:
        return self._self_pid

    def add(self, proc: FakeProc) -> FakeProc:
        self.procs[proc.pid] = proc
        return proc

    def marks(self, pid: int) -> ProcessMarks | None:
        proc = self.procs.get(pid)
        return proc.marks() if proc is not None else None

    def scan(self) -> tuple[ProcessMarks, ...]:
        return tuple(p.marks() for p in self.procs.values())

    def kill(self, pid: int) -> bool:
        self.killed.append(pid)
        proc = self.procs.get(pid)
        if proc is None:
            return False
        if not proc.survives_kill:
            del self.procs[pid]
        return True

    def reap(self, pids: Sequence[int]) -> None:
        pass

    def reap_orphans(self) -> list[int]:
        return []

    def oom_kill_count(self) -> int | None:
        return self.oom_kills

    def self_mark(self) -> str:
        return f"{self._self_pid}:1"
