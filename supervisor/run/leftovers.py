"""Before the first launch: processes of an earlier run of this instance, and other processes on
the target GPUs. Ours are killed; others stop the start (exit 1) unless the operator allows
killing them. Whose a process is comes from core.ownership.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import structlog

from supervisor.config import RunSettings
from supervisor.core.ownership import Owner, ProcessMarks, whose
from supervisor.core.ports import Clock, GpuSensor, Processes
from supervisor.core.redact import redact_line
from supervisor.errors import PreflightFailed
from supervisor.run.gpu_holders import listed_pids
from supervisor.run.state import RunState

log = structlog.get_logger("supervisor.run")

# Leftovers of an earlier run are SIGKILLed; how long to wait for them to exit. Processes stuck
# in D state while the kernel unpins take longer; the GPU release wait covers those.
LEFTOVER_EXIT_WAIT_S = 10.0
_KILL_POLL_S = 0.05


def classify_processes(
    processes: Processes,
    state: RunState,
    instance: str,
    gpu_pids: Iterable[int],
) -> tuple[tuple[ProcessMarks, ...], tuple[ProcessMarks, ...]]:
    """(ours, foreign live holders of the target GPUs): ours are the earlier run's processes
    anywhere on the host and the GPU holders core.ownership calls ours."""
    recorded = {p.pid: p.start_ticks for p in state.server_pids}
    on_gpu = set(gpu_pids)

    def owner(marks: ProcessMarks) -> Owner:
        return whose(
            marks,
            instance=instance,
            self_pid=processes.self_pid,
            self_mark=processes.self_mark(),
            recorded=recorded,
            on_target_gpu=marks.pid in on_gpu,
        )

    ours: dict[int, ProcessMarks] = {}
    foreign: dict[int, ProcessMarks] = {}
    for marks in processes.scan():
        if marks.is_zombie:
            # Already dead: it holds no memory and no GPU, and a SIGKILL cannot reach it. (One
            # the containment just killed in our cgroup may wait here for init to reap it.)
            continue
        judged = owner(marks)
        if judged is Owner.OURS:
            ours[marks.pid] = marks
        elif marks.pid in on_gpu and judged is not Owner.SELF:
            foreign[marks.pid] = marks
    return (
        tuple(ours[pid] for pid in sorted(ours)),
        tuple(foreign[pid] for pid in sorted(foreign)),
    )


def clean_leftovers(
    processes: Processes,
    state: RunState,
    settings: RunSettings,
    gpu_indices: Sequence[int],
    *,
    sensor: GpuSensor | None,
    clock: Clock,
    wait_released: Callable[[Sequence[int]], None],
    killed: Sequence[int] = (),
) -> None:
    """Kill processes of an earlier run of this instance; fail at once on other processes on the
    target GPUs (or, when allowed, kill them too); then wait for the GPUs, also for `killed`
    (what the containment already killed in our cgroup: a GPU frees a dead process's memory
    some time after it is gone, so a launch at once could find it still taken).

    Raises:
        PreflightFailed: foreign processes hold the target GPUs (their PIDs and titles named).
    """
    gpus = sensor.read_gpus() if sensor is not None else None
    found, foreign = classify_processes(
        processes, state, settings.instance, listed_pids(gpus, gpu_indices)
    )
    if found:
        log.warning(
            "leftovers_found",
            pids=[p.pid for p in found],
            titles=[redact_line(p.title)[:60] for p in found],
            previous_run_id=state.run_id or None,
        )
        left = kill_processes(found, processes, clock, LEFTOVER_EXIT_WAIT_S)
        log.warning("leftovers_killed", pids=[p.pid for p in found], still_present=list(left))
    if foreign and not settings.run.kill_foreign_gpu_processes:
        # Before any wait: with a foreign holder left alive, the release wait could only end
        # after release_timeout as "GPUs not released" (exit 6) instead of naming it (exit 1).
        named = ", ".join(f"pid {p.pid} ({redact_line(p.title)[:40]})" for p in foreign)
        raise PreflightFailed(
            f"other processes use the target GPUs {list(gpu_indices)}: {named}; stop them or "
            "pass --kill-foreign-gpu-processes"
        )
    if foreign:
        log.warning("foreign_gpu_processes_killed", pids=[p.pid for p in foreign])
        kill_processes(foreign, processes, clock, LEFTOVER_EXIT_WAIT_S)
    pids = dict.fromkeys((*killed, *(p.pid for p in (*found, *foreign))))
    if pids:
        wait_released(tuple(pids))


def kill_processes(
    targets: Sequence[ProcessMarks], processes: Processes, clock: Clock, timeout_s: float
) -> tuple[int, ...]:
    """SIGKILL `targets` and wait until they are gone; the PIDs still present at the deadline."""
    for target in targets:
        try:
            processes.kill(target.pid)
        except PermissionError:
            log.error("leftover_not_killable", pid=target.pid, reason="permission denied")
    deadline = clock.monotonic() + timeout_s
    pids = [t.pid for t in targets]
    while True:
        left = [
            pid
            for pid, t in zip(pids, targets, strict=True)
            if (now := processes.marks(pid)) is not None
            and now.start_ticks == t.start_ticks
            and not now.is_zombie
        ]
        processes.reap(pids)
        if not left or clock.monotonic() >= deadline:
            return tuple(left)
        clock.sleep(_KILL_POLL_S)
