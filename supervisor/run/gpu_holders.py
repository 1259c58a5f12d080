"""Whose the processes NVML lists on the target GPUs are, and judging each GPU by them: the
release wait's view of the holders (supervisor/run/gpu_wait.py). Ownership is core.ownership's,
the judgement core.gpu_release's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from supervisor.core.gpu_release import GpuCheck, assess_gpus
from supervisor.core.ownership import Owner, whose
from supervisor.core.ports import Processes
from supervisor.core.readings import GpuState

log = structlog.get_logger("supervisor.gpu_wait")


def listed_pids(gpus: Sequence[GpuState] | None, targets: Iterable[int]) -> set[int]:
    """PIDs NVML lists on the target GPUs."""
    wanted = set(targets)
    return {p.pid for g in gpus or () if g.index in wanted for p in g.processes}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Holders:
    """How the release wait sees the processes NVML lists on the GPUs."""

    is_ours: Callable[[int], bool]  # a listed PID this instance may kill
    state: Callable[[int], str | None]  # its /proc state letter, None when gone
    kill: Callable[[int], bool]  # SIGKILL it; False when it was already gone


def holders_of(processes: Processes, instance: str) -> Holders:
    """The GPU holders as this instance judges them (core.ownership) over a process table."""

    def is_ours(pid: int) -> bool:
        marks = processes.marks(pid)
        if marks is None:
            return False
        owner = whose(
            marks,
            instance=instance,
            self_pid=processes.self_pid,
            self_mark=processes.self_mark(),
            on_target_gpu=True,
        )
        return owner is Owner.OURS

    def process_state(pid: int) -> str | None:
        marks = processes.marks(pid)
        return None if marks is None else marks.state

    return Holders(is_ours=is_ours, state=process_state, kill=processes.kill)


def judge_holders(
    gpus: Sequence[GpuState] | None,
    targets: Sequence[int],
    known_ours: frozenset[int],
    holders: Holders,
    baselines: Mapping[str, int],
    tolerance_bytes: int,
) -> tuple[GpuCheck, ...]:
    """Each target GPU judged: whose the listed processes are, their states, the memory."""
    listed = listed_pids(gpus, targets)
    ours = known_ours | {pid for pid in listed - known_ours if holders.is_ours(pid)}
    return assess_gpus(
        gpus,
        targets,
        ours=ours,
        states={pid: holders.state(pid) for pid in listed},
        baselines=baselines,
        tolerance_bytes=tolerance_bytes,
    )


def kill_holders(pids: Sequence[int], kill: Callable[[int], bool], killed: set[int]) -> None:
    """SIGKILL each of `pids` once (noted in `killed`); another user's process is logged."""
    for pid in pids:
        killed.add(pid)
        try:
            gone = not kill(pid)
        except PermissionError:
            # Another user's process: not ours to kill. The wait runs out and ends in a named
            # exit 6 rather than an internal error (exit 70) restarted forever.
            log.error("gpu_holder_not_killable", pid=pid, reason="permission denied")
            continue
        log.warning("gpu_holder_killed", pid=pid, already_gone=gone)
