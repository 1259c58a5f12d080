"""Before the first launch and between launches: processes of an earlier run of this instance,
foreign processes on the target GPUs, and the wait until the GPUs of a dead run are free
(cleanup.wait_for_gpu_release, the watchdog issue's), feeding systemd's watchdog meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from supervisor import cleanup
from supervisor.adapters.procfs import ProcReader
from supervisor.core.classify import FailureKind
from supervisor.core.liveness import is_sglang_title
from supervisor.core.readings import ProcessInfo
from supervisor.core.redact import redact_line
from supervisor.errors import PreflightFailed
from supervisor.launch import RunSettings
from supervisor.ports import Clock, GpuResetter, GpuSensor
from supervisor.state import RunState, StateStore

log = structlog.get_logger("supervisor.run")

# Leftovers of an earlier run are SIGKILLed; how long to wait for them to exit. Processes stuck
# in D state while the kernel unpins take longer; the GPU release wait covers those.
LEFTOVER_EXIT_WAIT_S = 10.0


class GpuRelease:
    """Waits until the GPUs of a dead run are free; exit 6 (GpuUnrecoverable) when one stays
    dirty. A no-op without a GPU sensor (backend none)."""

    def __init__(
        self,
        settings: RunSettings,
        gpu_indices: Sequence[int],
        *,
        sensor: GpuSensor | None,
        store: StateStore,
        resetter: GpuResetter | None = None,
        hooks: Sequence[Callable[[cleanup.ReleaseResult], None]] = (),
        notify_status: Callable[[str], None] | None = None,
    ) -> None:
        self.gpu = settings.config.gpu
        self.indices = tuple(gpu_indices)
        self.sensor = sensor
        self.store = store
        self.resetter = resetter
        self.hooks = hooks
        self.notify_status = notify_status
        self.baselines: dict[str, int] = {}

    def measure_baselines(self) -> None:
        """Used memory per target GPU before the first launch: "released" means back near it."""
        if self.sensor is not None:
            self.baselines = cleanup.measure_baselines(self.sensor, self.indices)

    def wait(self, old_pids: Sequence[int], clock: Clock) -> None:
        """Block until no target GPU lists `old_pids` and memory is back near the baseline.

        `old_pids` may be empty (a tree killed whole from outside, by the OOM killer or an
        operator, is reaped before the supervisor reads it): the GPUs are checked all the same,
        since a tree that died unseen can leave them as dirty as one we killed.

        Raises:
            GpuUnrecoverable: a GPU stays held after kill, wait and reset.
            StopRequested: from `clock` (an EventClock), when a stop signal arrives.
        """
        if self.sensor is None:
            return
        result = cleanup.wait_for_gpu_release(
            self.sensor,
            self.indices,
            old_pids,
            timeout_s=self.gpu.release_timeout_s,
            clock=clock,
            baselines=self.baselines,
            tolerance_bytes=self.gpu.release_tolerance_bytes,
            resetter=self.resetter,
            d_state_grace_s=self.gpu.d_state_grace_s,
        )
        for hook in self.hooks:
            hook(result)
        if not result.ok:
            self.store.update(
                lambda s: dataclasses.replace(
                    s, last_failure=FailureKind.GPU_DIRTY.value, last_failure_hint=result.reason
                )
            )
        cleanup.raise_if_unrecoverable(result, self.notify_status)


def clean_leftovers(
    proc: ProcReader,
    state: RunState,
    settings: RunSettings,
    gpu_indices: Sequence[int],
    *,
    sensor: GpuSensor | None,
    clock: Clock,
    wait_released: Callable[[Sequence[int]], None],
) -> None:
    """Before the first launch: kill processes of an earlier run of this instance; fail at once on
    other processes on the target GPUs (or, when allowed, kill them too); then wait for the GPUs.

    Raises:
        PreflightFailed: foreign processes hold the target GPUs (their PIDs and titles named).
    """
    gpus = sensor.read_gpus() if sensor is not None else None
    found = find_leftovers(proc, state, settings.instance, gpus, gpu_indices)
    foreign = foreign_gpu_holders(proc, gpus, gpu_indices, ours=(p.pid for p in found))
    if found:
        log.warning(
            "leftovers_found",
            pids=[p.pid for p in found],
            titles=[redact_line(p.title)[:60] for p in found],
            previous_run_id=state.run_id or None,
        )
        left = kill_processes(found, proc, clock, LEFTOVER_EXIT_WAIT_S)
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
        kill_processes(foreign, proc, clock, LEFTOVER_EXIT_WAIT_S)
    if found or foreign:
        wait_released(tuple(p.pid for p in (*found, *foreign)))


def find_leftovers(
    proc: ProcReader,
    state: RunState,
    instance: str,
    gpu_states: Iterable[Any] | None,
    gpu_indices: Sequence[int],
) -> tuple[ProcessInfo, ...]:
    """Processes of an earlier run of this instance: recorded PIDs (start time checked), our
    environment marker, or an SGLang title on one of the target GPUs."""
    recorded = [(p.pid, p.start_ticks) for p in state.server_pids]
    found = {p.pid: p for p in proc.find_leftovers(instance=instance, recorded=recorded)}
    for pid in _gpu_pids(gpu_states, gpu_indices):
        info = proc.read_process(pid)
        # A live supervisor's tree is never a leftover (another instance can leave a stray CUDA
        # context on our GPUs): it is reported as a foreign holder instead.
        if (
            info is not None
            and pid != os.getpid()
            and is_sglang_title(info.title)
            and not proc.supervised_by_another(pid)
        ):
            found.setdefault(pid, info)
    return tuple(found[pid] for pid in sorted(found))


def foreign_gpu_holders(
    proc: ProcReader,
    gpu_states: Iterable[Any] | None,
    gpu_indices: Sequence[int],
    ours: Iterable[int] = (),
) -> tuple[ProcessInfo, ...]:
    """Live processes on the target GPUs that are not ours (NVML's lists); a zombie holds no GPU
    memory any more and is nobody to stop."""
    mine = set(ours) | {os.getpid()}
    infos = (proc.read_process(pid) for pid in _gpu_pids(gpu_states, gpu_indices) - mine)
    live = (i for i in infos if i is not None and not i.is_zombie)
    return tuple(sorted(live, key=lambda i: i.pid))


def _gpu_pids(gpu_states: Iterable[Any] | None, gpu_indices: Sequence[int]) -> set[int]:
    wanted = set(gpu_indices)
    return {p.pid for g in gpu_states or () if g.index in wanted for p in g.processes}


def kill_processes(
    procs: Sequence[ProcessInfo], proc: ProcReader, clock: Clock, timeout_s: float
) -> tuple[int, ...]:
    """SIGKILL `procs` and wait until they are gone; the PIDs still present at the deadline."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, signal.SIGKILL)
    deadline = clock.monotonic() + timeout_s
    while True:
        left = [
            p.pid
            for p in procs
            if (now := proc.read_process(p.pid)) is not None and not now.is_zombie
        ]
        _reap_children(p.pid for p in procs)
        if not left or clock.monotonic() >= deadline:
            return tuple(left)
        clock.sleep(0.05)


def _reap_children(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
