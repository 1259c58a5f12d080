"""core.gpu_release: synthetic GPU snapshots, no processes, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.gpu_release import (
    NVML_RETRY_MAX_S,
    GpuCheck,
    GpuCondition,
    ReleaseAction,
    ReleaseDecision,
    assess_gpu,
    assess_gpus,
    decide_release,
    nvml_retry_after_s,
)
from supervisor.core.readings import GpuProcess, GpuState

GB = 10**9


def gpu(index: int = 0, used: int = 0, *pids: int) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        name="sim",
        total_bytes=80 * GB,
        used_bytes=used,
        processes=tuple(GpuProcess(pid=p, used_bytes=None) for p in pids),
    )


def judge(g: GpuState | None, states: dict[int, str | None], ours=(100, 101), baseline=0):
    return assess_gpu(
        0,
        g,
        ours=frozenset(ours),
        states=states,
        baseline_bytes=baseline,
        tolerance_bytes=GB // 2,
    )


@pytest.mark.parametrize(
    ("snapshot", "states", "condition"),
    [
        (gpu(0, 0), {}, GpuCondition.CLEAN),
        (gpu(0, 2 * GB, 100), {100: "S"}, GpuCondition.HELD_BY_OURS),
        (gpu(0, 2 * GB, 100), {100: "D"}, GpuCondition.HELD_D_STATE),
        (gpu(0, 2 * GB, 100), {100: None}, GpuCondition.RELEASING),
        (gpu(0, 0, 100), {100: "Z"}, GpuCondition.RELEASING),
        (gpu(0, 2 * GB), {}, GpuCondition.RELEASING),
        (gpu(0, 2 * GB, 555), {555: "S"}, GpuCondition.HELD_FOREIGN),
        (gpu(0, GB // 4, 555), {555: "S"}, GpuCondition.CLEAN),
        (gpu(0, GB // 4, 777), {777: None}, GpuCondition.CLEAN),
        (None, {}, GpuCondition.UNKNOWN),
    ],
    ids=[
        "idle",
        "live-ours",
        "d-state",
        "exited-still-listed",
        "zombie-listed",
        "memory-without-process",
        "foreign-over-baseline",
        "foreign-within-baseline",
        "invisible-foreign-pid",
        "nvml-no-answer",
    ],
)
def test_each_gpu_is_judged_from_processes_and_memory(snapshot, states, condition):
    assert judge(snapshot, states).condition is condition


def test_memory_within_tolerance_of_the_baseline_counts_as_clean():
    check = judge(gpu(0, 3 * GB), {}, baseline=3 * GB - GB // 4)
    assert check.is_clean
    assert not judge(gpu(0, 3 * GB), {}, baseline=2 * GB).is_clean


def test_a_missing_target_gpu_is_unknown_and_baselines_are_keyed_by_uuid():
    checks = assess_gpus(
        [gpu(0, 5 * GB), gpu(1, 5 * GB)],
        [1, 3],
        ours=frozenset(),
        states={},
        baselines={"GPU-1": 5 * GB},
        tolerance_bytes=0,
    )
    assert [c.condition for c in checks] == [GpuCondition.CLEAN, GpuCondition.UNKNOWN]
    assert assess_gpus(None, [0], ours=frozenset(), states={}, baselines={}, tolerance_bytes=0)[
        0
    ].condition is (GpuCondition.UNKNOWN)


def decide(checks: list[GpuCheck], elapsed: float = 0.0, **kw: Any) -> ReleaseDecision:
    args: dict[str, Any] = {
        "elapsed_s": elapsed,
        "timeout_s": 120.0,
        "d_state_grace_s": 60.0,
        "killed_pids": frozenset(),
        "reset_available": True,
        "reset_at_s": {},
        "reset_failed": {},
        "reset_settle_s": 5.0,
    }
    args.update(kw)
    return decide_release(checks, **args)


def check(condition: GpuCondition, index: int = 0, **kw: Any) -> GpuCheck:
    return GpuCheck(index=index, uuid=f"GPU-{index}", condition=condition, **kw)


def test_clean_gpus_are_done():
    assert decide([check(GpuCondition.CLEAN)]).action is ReleaseAction.DONE


def test_live_holders_of_ours_are_killed_at_once_and_only_once():
    held = [check(GpuCondition.HELD_BY_OURS, live_ours=(7, 5))]
    first = decide(held, elapsed=0.0)
    assert first.action is ReleaseAction.KILL
    assert first.kill_pids == (5, 7)
    again = decide(held, elapsed=1.0, killed_pids=frozenset({5, 7}))
    assert again.action is ReleaseAction.WAIT


def test_a_holder_surviving_sigkill_past_the_timeout_gives_up():
    held = [check(GpuCondition.HELD_BY_OURS, live_ours=(5,))]
    decision = decide(held, elapsed=121.0, killed_pids=frozenset({5}))
    assert decision.action is ReleaseAction.GIVE_UP
    assert "survived SIGKILL" in decision.reason


def test_releasing_memory_is_waited_for_until_the_timeout_then_reset():
    dirty = [check(GpuCondition.RELEASING, used_bytes=GB), check(GpuCondition.CLEAN, index=1)]
    assert decide(dirty, elapsed=119.9).action is ReleaseAction.WAIT
    reset = decide(dirty, elapsed=120.0)
    assert reset.action is ReleaseAction.RESET
    assert [c.index for c in reset.reset_gpus] == [0]


def test_after_a_reset_the_gpu_gets_a_settle_time_then_dirty_means_give_up():
    dirty = [check(GpuCondition.RELEASING)]
    settling = decide(dirty, elapsed=122.0, reset_at_s={0: 120.0})
    assert settling.action is ReleaseAction.WAIT
    final = decide(dirty, elapsed=125.0, reset_at_s={0: 120.0})
    assert final.action is ReleaseAction.GIVE_UP
    assert "after reset" in final.reason


def test_a_failed_reset_gives_up_immediately():
    decision = decide(
        [check(GpuCondition.RELEASING)],
        elapsed=121.0,
        reset_at_s={0: 120.5},
        reset_failed={0: "exit status 3"},
    )
    assert decision.action is ReleaseAction.GIVE_UP
    assert "exit status 3" in decision.reason


def test_without_a_reset_command_held_memory_gives_up_at_the_timeout():
    decision = decide([check(GpuCondition.RELEASING)], elapsed=120.0, reset_available=False)
    assert decision.action is ReleaseAction.GIVE_UP
    assert "reset_command" in decision.reason


def test_d_state_holders_are_waited_for_during_the_grace_then_give_up_never_reset():
    held = [check(GpuCondition.HELD_D_STATE, d_state=(9,))]
    assert decide(held, elapsed=150.0).action is ReleaseAction.WAIT
    final = decide(held, elapsed=180.0)
    assert final.action is ReleaseAction.GIVE_UP
    assert "D state" in final.reason


def test_unknown_and_foreign_gpus_give_up_at_the_timeout_without_reset():
    assert decide([check(GpuCondition.UNKNOWN)], elapsed=10.0).action is ReleaseAction.WAIT
    unknown = decide([check(GpuCondition.UNKNOWN)], elapsed=120.0)
    assert unknown.action is ReleaseAction.GIVE_UP
    assert "unknown" in unknown.reason
    foreign = decide([check(GpuCondition.HELD_FOREIGN, foreign=(42,))], elapsed=120.0)
    assert foreign.action is ReleaseAction.GIVE_UP
    assert "42" in foreign.reason


def test_describe_names_the_pids_and_bytes():
    text = check(
        GpuCondition.HELD_D_STATE, used_bytes=3, baseline_bytes=1, d_state=(9,), foreign=(4,)
    ).describe()
    assert "GPU 0: held_d_state" in text
    assert "D-state pids 9" in text
    assert "foreign pids 4" in text
    assert "used 3 B" in text


def test_sizes_read_with_units_for_humans_and_stay_integers_for_programs():
    held = check(GpuCondition.RELEASING, used_bytes=136_517_718_638, baseline_bytes=512 * 1024**2)
    assert "used 127.1 GiB (baseline 512.0 MiB)" in held.describe()
    data = held.to_json()
    assert (data["used_bytes"], data["baseline_bytes"]) == (136_517_718_638, 512 * 1024**2)
    assert data["condition"] == "releasing"
    assert data["detail"] == held.describe()


def test_nvml_is_asked_again_within_a_quarter_of_the_release_wait_then_less_often():
    assert nvml_retry_after_s(120.0, 1) == 30.0  # the default wait: as before
    assert nvml_retry_after_s(10.0, 1) == 2.5  # a short wait still gets about four tries
    assert [nvml_retry_after_s(10.0, n) for n in (2, 3, 4, 5)] == [5.0, 10.0, 20.0, 30.0]
    assert nvml_retry_after_s(10.0, 10**9) == NVML_RETRY_MAX_S  # days of hangs: no overflow
    assert nvml_retry_after_s(1.0, 0) == 0.25
