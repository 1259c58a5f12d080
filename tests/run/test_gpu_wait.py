"""run.gpu_wait: the release wait driven by scripted GPU snapshots and a fake clock (no
processes), and GpuRelease judging holders through a fake process table."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from supervisor.config import SupervisorConfig
from supervisor.errors import ExitCode, GpuUnrecoverable
from supervisor.run.gpu_holders import Holders
from supervisor.run.gpu_wait import (
    GpuRelease,
    ReleaseLimits,
    ReleaseResult,
    measure_baselines,
    raise_if_unrecoverable,
    wait_for_gpu_release,
)
from supervisor.run.state import StateStore
from tests.fakes import (
    FakeClock,
    FakeProc,
    FakeProcesses,
    RecordingResetter,
    ScriptedGpus,
    gpu,
)

GB = 10**9


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
        baselines={"GPU-0": 0, "GPU-1": 0},
        resetter=resetter,
        limits=ReleaseLimits(timeout_s=120.0, tolerance_bytes=GB // 2, d_state_grace_s=60.0),
        holders=Holders(
            is_ours=lambda pid: False,
            state=lambda pid: known.get(pid),
            kill=kill or (lambda pid: True),
        ),
    )


def test_delayed_release_is_waited_for_then_done():
    clock = FakeClock(start_s=0.0)
    sensor = ScriptedGpus(
        clock, lambda t: (gpu(0, 5 * GB, 100), gpu(1, 0)) if t < 30 else (gpu(0, 0), gpu(1, 0))
    )
    result = run(sensor, clock)
    assert result.ok
    assert 30.0 <= result.elapsed_s < 31.0
    assert result.killed_pids == ()
    assert result.reset_gpus == ()


def test_a_live_orphan_of_ours_is_killed_once_and_the_gpu_then_frees():
    clock = FakeClock(start_s=0.0)
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
    clock = FakeClock(start_s=0.0)
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
    clock = FakeClock(start_s=0.0)
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
    clock = FakeClock(start_s=0.0)
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
    clock = FakeClock(start_s=0.0)
    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 5 * GB), gpu(1, 0)))
    result = run(sensor, clock)
    assert not result.ok
    assert 120.0 <= result.elapsed_s < 121.0


def test_a_d_state_holder_is_waited_for_and_never_re_killed():
    clock = FakeClock(start_s=0.0)
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
    clock = FakeClock(start_s=0.0)
    result = run(ScriptedGpus(clock, lambda t: None), clock)
    assert not result.ok
    assert "unknown" in result.reason


def test_no_visible_gpus_or_no_targets_means_nothing_to_wait_for():
    clock = FakeClock(start_s=0.0)
    assert run(ScriptedGpus(clock, lambda t: ()), clock).ok
    nobody = Holders(is_ours=lambda pid: False, state=lambda pid: None, kill=lambda pid: False)
    assert wait_for_gpu_release(
        ScriptedGpus(clock, lambda t: None), [], [1], clock=clock, holders=nobody
    ).ok


def _release(tmp_path, sensor, processes, resetter=None) -> GpuRelease:
    return GpuRelease(
        SupervisorConfig().gpu,
        [0],
        instance="mine",
        sensor=sensor,
        processes=processes,
        store=StateStore(tmp_path),
        resetter=resetter,
    )


def test_a_tree_that_died_unseen_still_gets_its_gpus_checked_before_a_relaunch(tmp_path):
    """A tree killed whole from outside (the OOM killer, an operator's kill -9 of the group) is
    reaped before the supervisor reads it: no PIDs are known, yet the memory it left is there."""
    clock = FakeClock(start_s=0.0)
    resetter = RecordingResetter(ok=False)
    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 5 * GB),))
    release = _release(tmp_path, sensor, FakeProcesses(), resetter)
    with pytest.raises(GpuUnrecoverable):
        release.wait((), clock)
    assert resetter.calls == [(0, "GPU-0")]
    assert StateStore(tmp_path).load().last_failure == "gpu_dirty"


def test_unrecorded_holders_are_killed_when_ours_and_left_alone_otherwise(tmp_path):
    """An escaped SGLang process, or one carrying our instance's marker, is killed; a stranger
    and another live supervisor's rank are waited for and named."""
    clock = FakeClock(start_s=0.0)
    processes = FakeProcesses(
        [
            FakeProc(pid=10, title="sglang::scheduler_TP0"),
            FakeProc(pid=11, title="python worker.py", instance="mine"),
            FakeProc(pid=12, title="python train.py"),
            FakeProc(
                pid=13, title="sglang::scheduler_TP0", launched_by="77:1", launcher_alive=True
            ),
        ]
    )
    sensor = ScriptedGpus(
        clock, lambda t: (gpu(0, 5 * GB, *(p for p in processes.procs if p != 1)),)
    )
    release = _release(tmp_path, sensor, processes)
    with pytest.raises(GpuUnrecoverable) as err:
        release.wait((), clock)
    assert sorted(processes.killed) == [10, 11]
    assert "foreign pids 12, 13" in str(err.value)


def test_baselines_are_measured_per_target_uuid():
    clock = FakeClock(start_s=0.0)
    sensor = ScriptedGpus(clock, lambda t: (gpu(0, 3), gpu(1, 4), gpu(2, 5)))
    assert measure_baselines(sensor, [0, 2]) == {"GPU-0": 3, "GPU-2": 5}
    assert measure_baselines(ScriptedGpus(clock, lambda t: None), [0]) == {}
