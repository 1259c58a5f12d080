"""Whose is this process? The one answer used by leftover cleanup, the foreign-holder check and
the GPU release wait.

Pure: the procfs adapter reads each process's marks (start time, state, title, and the markers
the supervisor puts into the server's environment, which every descendant inherits, escapees
included); this module decides.

    the supervisor itself ───────────────────────────────────────────────> SELF
    recorded by our state file (PID and start time match) ────────────────> OURS
    launched by another supervisor that is still alive ──────────────────> OTHER_SUPERVISOR
    carries our instance's marker ───────────────────────────────────────> OURS
    on one of our target GPUs with an SGLang title or any supervisor's
    marker (its supervisor is gone: nobody else will clean it) ──────────> OURS
    anything else ───────────────────────────────────────────────────────> FOREIGN
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from supervisor.core.sglang_facts import TITLE_PREFIX as SGLANG_TITLE_PREFIX


class Owner(str, Enum):
    SELF = "self"
    OURS = "ours"
    OTHER_SUPERVISOR = "other_supervisor"
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessMarks:
    """What identifies one process: read from /proc/PID/{stat,cmdline,environ}."""

    pid: int
    start_ticks: int
    state: str  # one letter, as in /proc/PID/stat
    title: str
    instance: str | None = None  # the supervisor instance marker in its environment
    launched_by: str | None = None  # "<pid>:<start ticks>" of the supervisor that launched it
    launcher_alive: bool = False  # that supervisor is still running

    @property
    def is_zombie(self) -> bool:
        return self.state in ("Z", "X", "x")


def is_sglang_title(title: str) -> bool:
    """Any of SGLang's titled subprocesses (scheduler, detokenizer, DP controller, workers)."""
    return title.startswith(SGLANG_TITLE_PREFIX)


def whose(
    marks: ProcessMarks,
    *,
    instance: str,
    self_pid: int,
    self_mark: str,
    recorded: Mapping[int, int] | None = None,
    on_target_gpu: bool = False,
) -> Owner:
    """Decide who owns `marks` (see the module docstring for the rules, first match wins).

    `recorded` maps PIDs of our last run to their start ticks (from the state file);
    `on_target_gpu` says NVML lists the process on one of this launch's GPUs.
    """
    if marks.pid == self_pid:
        return Owner.SELF
    if recorded is not None and recorded.get(marks.pid) == marks.start_ticks:
        return Owner.OURS
    if marks.launched_by is not None and marks.launched_by != self_mark and marks.launcher_alive:
        return Owner.OTHER_SUPERVISOR
    if marks.instance == instance:
        return Owner.OURS
    if on_target_gpu and (is_sglang_title(marks.title) or marks.instance is not None):
        return Owner.OURS
    return Owner.FOREIGN
