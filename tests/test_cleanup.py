"""cleanup.wait_for_gpu_release driven by scripted GPU snapshots and a fake clock (no processes)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from supervisor.cleanup import (
    ReleaseResult,
    measure_baselines,
    raise_if_unrecoverable,
    wait_for_gpu_release,
)
from supervisor.core.gpu_release import ResetOutcome
from supervisor.core.readings import GpuProcess, GpuState
from supervisor.errors import ExitCode, GpuUnrecoverable

GB = 10**9


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedGpus:
    """GPU snapshots computed from the fake clock and the world state the test mutates."""

    def __init__(self, clock: FakeClock, snapshot: Callable[[float], tuple[GpuState, ...] | None]):
        self.clock = clock
        self.snapshot = snapshot
        self.closed = 0

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        return self.snapshot(self.clock.now - 1000.0)

    def close(self) -> None:
        self.closed += 1


class RecordingResetter:
    def __init__(self, ok: bool = True, on_reset: Callable[[int], None] | None = None) -> None:
        self.ok = ok
        self.calls: list[tuple[int, str]] = []
        self.on_reset = on_reset

    def reset(self, index: int, uuid: str) -> ResetOutcome:
        self.calls.append((index, uuid))
        if self.on_reset is not None:
            self.on_reset(index)
        return ResetOutcome(ok=self.ok, detail="" if self.ok else "in use")


def gpu(index: int, used: int, *pids: int) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        name="sim",
        total_bytes=80 * GB,
        used_bytes=used,
        processes=tuple(GpuProcess(pid=p, used_bytes=used) for p in pids),
    )


def run(
    sensor: ScriptedGpus,
    clock: FakeClock,
    *,
    old_pids: tuple[int, ...] = (100,),
    states: dict[int, str] | None = None,
    kill: Callable[[int], bool] | None = None,
    resetter: RecordingResetter | None = None,
) -> ReleaseResult:
    known: dict[int, str] = states if states is not None else {}
    return wait_for_gpu_release(
        sensor,
        [0, 1],
        old_pids,
        clock=clock,
        timeout_s=120.0,
        baselines={"GPU-0": 0, "GPU-1": 0},
        tolerance_bytes=GB // 2,
        resetter=resetter,
        d_state_grace_s=60.0,
        is_ours=lambda pid: False,
        process_state=lambda pid: known.get(pid),
        kill=kill or (lambda pid: True),
    )


def test_delayed_release_is_waited_for_then_done():
    clock = FakeClock()
    sensor = ScriptedGpus(
        clock, lambda t: (gpu(0, 5 * GB, 100), gpu(1, 0)) if t < 30 else (gpu(0, 0), gpu(1, 0))
    )
    result = run(sensor, clock)
    assert result.ok
    assert 30.0 <= result.elapsed_s < 31.0
    assert result.killed_pids == ()
    assert result.reset_gpus == ()


def test_a_live_orphan_of_ours_is_killed_once_and_the_gpu_then_frees():
    clock = FakeClock()
    alive = {100: "S"}
    killed: list[int] = []

    def kill(pid: int) -> bool:
        killed.append(pid)
        alive.pop(pid)
        return True

    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 5 * GB if alive else 0, *alive), gpu(1, 0)))
    result = run(sensor, clock, states=alive, kill=kill)
    assert result.ok
    assert killed == [100]
    assert result.killed_pids == (100,)


def test_a_holder_we_may_not_kill_ends_in_a_failed_release_not_a_crash():
    clock = FakeClock()
    tried: list[int] = []

    def kill(pid: int) -> bool:
        tried.append(pid)
        raise PermissionError(1, "Operation not permitted")

    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 5 * GB, 100), gpu(1, 0)))
    result = run(sensor, clock, states={100: "S"}, kill=kill)
    assert not result.ok
    assert tried == [100]
    assert result.killed_pids == (100,)


def test_stuck_memory_is_reset_after_the_timeout_and_then_relaunch_is_allowed():
    clock = FakeClock()
    stuck = {1}
    sensor = ScriptedGpus(
        clock, lambda t: tuple(gpu(i, 5 * GB if i in stuck else 0) for i in (0, 1))
    )
    resetter = RecordingResetter(on_reset=stuck.discard)
    result = run(sensor, clock, resetter=resetter)
    assert result.ok
    assert resetter.calls == [(1, "GPU-1")]
    assert result.reset_gpus == (1,)
    assert result.elapsed_s >= 120.0
    assert sensor.closed == 1, "our NVML handle must be closed before a reset"


def test_a_failed_reset_gives_up_with_exit_code_6():
    clock = FakeClock()
    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 5 * GB), gpu(1, 0)))
    result = run(sensor, clock, resetter=RecordingResetter(ok=False))
    assert not result.ok
    assert "reset failed" in result.reason
    statuses: list[str] = []
    with pytest.raises(GpuUnrecoverable) as err:
        raise_if_unrecoverable(result, statuses.append)
    assert err.value.exit_code is ExitCode.GPU_UNRECOVERABLE
    assert statuses
    assert statuses[0].startswith("gpu unrecoverable")


def test_no_reset_command_gives_up_at_the_timeout():
    clock = FakeClock()
    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 5 * GB), gpu(1, 0)))
    result = run(sensor, clock)
    assert not result.ok
    assert 120.0 <= result.elapsed_s < 121.0


def test_a_d_state_holder_is_waited_for_and_never_re_killed():
    clock = FakeClock()
    kills: list[int] = []

    def kill(pid: int) -> bool:
        kills.append(pid)
        return True

    sensor = ScriptedGpus(
        clock, lambda t: (gpu(0, 5 * GB, 100), gpu(1, 0)) if t < 150 else (gpu(0, 0), gpu(1, 0))
    )
    result = run(sensor, clock, states={100: "D"}, kill=kill)
    assert result.ok
    assert kills == []
    assert result.d_state_pids == (100,)
    assert result.elapsed_s >= 150.0


def test_nvml_without_answer_gives_up_after_the_timeout():
    clock = FakeClock()
    result = run(ScriptedGpus(clock, lambda t: None), clock)
    assert not result.ok
    assert "unknown" in result.reason


def test_no_visible_gpus_or_no_targets_means_nothing_to_wait_for():
    clock = FakeClock()
    assert run(ScriptedGpus(clock, lambda t: ()), clock).ok
    assert wait_for_gpu_release(
        ScriptedGpus(clock, lambda t: None), [], [1], clock=clock, timeout_s=1.0
    ).ok


def test_a_tree_that_died_unseen_still_gets_its_gpus_checked_before_a_relaunch(tmp_path):
    """A tree killed whole from outside (the OOM killer, an operator's kill -9 of the group) is
    reaped before the supervisor reads it: no PIDs are known, yet the memory it left is there."""
    from supervisor.config import SupervisorConfig
    from supervisor.launch import RunSettings
    from supervisor.leftovers import GpuRelease
    from supervisor.state import StateStore

    clock = FakeClock()
    settings = RunSettings(
        config=SupervisorConfig(),
        server_command=("server",),
        server_args=(),
        state_dir=tmp_path,
    )
    resetter = RecordingResetter(ok=False)
    release = GpuRelease(
        settings,
        [0],
        sensor=ScriptedGpus(clock, lambda t: (gpu(0, 5 * GB),)),
        store=StateStore(tmp_path),
        resetter=resetter,
    )
    with pytest.raises(GpuUnrecoverable):
        release.wait((), clock)
    assert resetter.calls == [(0, "GPU-0")]


def test_baselines_are_measured_per_target_uuid():
    clock = FakeClock()
    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 3), gpu(1, 4), gpu(2, 5)))
    assert measure_baselines(sensor, [0, 2]) == {"GPU-0": 3, "GPU-2": 5}
    assert measure_baselines(ScriptedGpus(clock, lambda t: None), [0]) == {}


def test_unrecorded_processes_are_ours_by_title_or_by_the_supervisor_marker():
    import os
    import subprocess
    import sys
    import uuid

    from supervisor.adapters.procfs import INSTANCE_ENV
    from supervisor.cleanup import is_ours_by_sight

    code = "import time; time.sleep(30)"
    marked = subprocess.Popen(
        # A name no supervisor runs under: a starting one kills its instance's marked processes.
        [sys.executable, "-c", code],
        env={**os.environ, INSTANCE_ENV: f"test-{uuid.uuid4().hex}"},
    )
    plain = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert is_ours_by_sight(marked.pid)
        assert not is_ours_by_sight(plain.pid)
    finally:
        for proc in (marked, plain):
            proc.kill()
            proc.wait()
