"""core.gpu_repair: when a reset may run and over which GPUs, and what the health says once the
GPUs are free again."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.gpu_health import GpuHealth, HealthSnapshot, judge_gpu
from supervisor.core.gpu_release import ReleaseAction
from supervisor.core.gpu_repair import (
    decide_after_release,
    plan_reset,
    reset_status,
    reset_words,
    resets_peer_sets,
)


def healthy(index: int, **changes: Any) -> GpuHealth:
    fields: dict[str, Any] = {
        "volatile_dbe": 0,
        "remap_pending": False,
        "remap_failed": False,
        "persistence_on": True,
        "fabric": None,
    }
    fields.update(changes)
    return GpuHealth(index=index, uuid=f"GPU-{index}", **fields)


FOUR = HealthSnapshot(gpus=tuple(healthy(i) for i in range(4)), nvlink=((0, 1), (2, 3)))


def test_the_reset_command_takes_the_peer_set_with_indices():
    assert resets_peer_sets("nvidia-smi -r -i {indices}")
    assert not resets_peer_sets("nvidia-smi -r -i {index}")
    words = reset_words("hook --gpus {indices} --uuid={uuid} '{index} x'", 1, "GPU-1", (0, 1))
    assert words == ["hook", "--gpus", "0,1", "--uuid=GPU-1", "1 x"]
    assert reset_words("r {indices}", 2, "GPU-2") == ["r", "2"]  # no set: the GPU alone


def test_per_gpu_resets_ignore_nvlink():
    plan = plan_reset([1, 2], health=FOUR, live_pids={}, peer_sets=False)
    assert (plan.sets, plan.refusal) == (((1,), (2,)), "")


def test_peer_set_resets_take_each_gpus_whole_set_once():
    plan = plan_reset([1, 0, 3], health=FOUR, live_pids={}, peer_sets=True)
    assert plan.sets == ((0, 1), (2, 3))


def test_without_a_health_reading_each_gpu_is_its_own_set():
    assert plan_reset([1], health=None, live_pids={}, peer_sets=True).sets == ((1,),)


def test_a_lost_gpu_is_never_reset_a_reboot_is_needed():
    snapshot = HealthSnapshot(gpus=(healthy(0), GpuHealth(index=1, uuid="", lost=True)))
    plan = plan_reset([1], health=snapshot, live_pids={}, peer_sets=False)
    assert plan.sets == ()
    assert "GPU 1 is lost" in plan.refusal
    assert "reboot needed" in plan.refusal


def test_a_lost_peer_stops_the_reset_of_its_set():
    snapshot = HealthSnapshot(
        gpus=(healthy(0), GpuHealth(index=1, uuid="", lost=True)), nvlink=((0, 1),)
    )
    assert "GPU 1 is lost" in plan_reset([0], health=snapshot, live_pids={}, peer_sets=True).refusal


def test_a_process_on_a_gpu_of_the_set_stops_the_reset_and_is_named():
    plan = plan_reset([1], health=FOUR, live_pids={0: (4242,)}, peer_sets=True)
    assert plan.sets == ()
    assert plan.refusal == (
        "GPU 0 (an NVLink peer, reset with them) has running processes 4242: a reset needs "
        "every process off the GPU"
    )
    alone = plan_reset([1], health=FOUR, live_pids={1: (7, 8)}, peer_sets=False)
    assert alone.refusal.startswith("GPU 1 has running processes 7, 8")
    # A process on a GPU outside the set is no concern of this reset.
    assert plan_reset([1], health=FOUR, live_pids={2: (9,)}, peer_sets=True).refusal == ""


def after(verdicts: Any = (), **kw: Any) -> Any:
    args: dict[str, Any] = {
        "wanted": (),
        "reset_failed": {},
        "repair": True,
        "enforce": True,
        "reset_available": True,
        "reset_at_s": {},
        "elapsed_s": 10.0,
        "reset_settle_s": 5.0,
    }
    args.update(kw)
    return decide_after_release(tuple(verdicts), **args)


REMAP = judge_gpu(healthy(1, remap_pending=True))
LOST = judge_gpu(GpuHealth(index=1, uuid="", lost=True))
OK = judge_gpu(healthy(1))


def test_healthy_gpus_are_done():
    assert after([OK]).action is ReleaseAction.DONE


def test_a_gpu_that_needs_a_reset_gets_one_after_a_launch_of_ours():
    decision = after([REMAP])
    assert decision.action is ReleaseAction.RESET
    assert [(c.index, c.uuid) for c in decision.reset_gpus] == [(1, "GPU-1")]
    assert "a row remap is pending" in decision.reason


@pytest.mark.parametrize(
    "kw",
    [
        {"repair": False},  # before the first launch: the gate refuses, the operator decides
        {"enforce": False},  # warn mode: reported only
        {"reset_available": False},  # no reset_command: the gate refuses and names it
    ],
)
def test_otherwise_a_gpu_that_needs_a_reset_is_left_to_the_gate(kw):
    assert after([REMAP], **kw).action is ReleaseAction.DONE


def test_a_reset_cannot_help_a_lost_gpu_so_none_is_tried():
    assert after([LOST]).action is ReleaseAction.DONE  # the gate refuses it: reboot


def test_a_gpu_still_sick_after_its_reset_ends_the_wait_once_settled():
    waiting = after([REMAP], reset_at_s={1: 8.0})
    assert waiting.action is ReleaseAction.WAIT
    given_up = after([REMAP], reset_at_s={1: 4.0})
    assert given_up.action is ReleaseAction.GIVE_UP
    assert given_up.reason.startswith("still failing its health check after a reset: GPU 1")
    assert after([REMAP], reset_at_s={1: 4.0}, enforce=False).action is ReleaseAction.DONE


def test_a_failed_reset_ends_the_wait():
    decision = after([OK], reset_failed={1: "exit 3: in use"})
    assert (decision.action, decision.reason) == (
        ReleaseAction.GIVE_UP,
        "GPU 1 reset failed: exit 3: in use",
    )


def test_gpus_the_driver_asked_to_reset_are_reset_whatever_their_health():
    decision = after([OK], wanted=(1,), repair=False, enforce=False)
    assert [c.index for c in decision.reset_gpus] == [1]
    assert after([OK], wanted=(1,), reset_at_s={1: 1.0}).action is ReleaseAction.DONE


def test_a_reset_asked_for_without_a_reset_command_ends_the_wait():
    decision = after([OK], wanted=(1,), reset_available=False)
    assert decision.action is ReleaseAction.GIVE_UP
    assert decision.reason == "GPU(s) 1 need a reset and no gpu reset_command is configured"


def test_the_status_of_parallel_resets_says_how_many_ended_and_which_failed():
    sets = [(0,), (1,), (2, 3)]
    assert reset_status(sets, {}, 0.2) == "resetting GPU(s) 0, 1, 2, 3: 0 of 3 done; 0 s"
    ended = {(0,): True, (2, 3): False}
    assert reset_status(sets, ended, 61.6) == (
        "resetting GPU(s) 0, 1, 2, 3: 2 of 3 done; failed: 2, 3; 62 s"
    )
