"""The GPU release wait with the GPUs' health (run/gpu_repair.py through run/gpu_wait.py), on
scripted GPUs and a fake clock: a GPU that needs a reset gets one after a launch of ours (never
before the first), the reset runs on whole NVLink peer sets with `{indices}`, never on a lost GPU
or one with a process on it, and a GPU still sick after its reset means no relaunch (exit 6)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.config import GpuConfig
from supervisor.core.gpu_health import FabricState, GpuHealth, HealthSnapshot
from supervisor.errors import GpuUnrecoverable
from supervisor.run.gpu_holders import Holders
from supervisor.run.gpu_repair import HealthRules
from supervisor.run.gpu_wait import (
    GpuRelease,
    ReleaseLimits,
    ReleaseResult,
    raise_if_unrecoverable,
    wait_for_gpu_release,
)
from supervisor.run.state import StateStore
from tests.fakes import FakeClock, FakeProcesses, RecordingResetter, ScriptedGpus, gpu

ENFORCE = HealthRules(mode="enforce", repair=True)
NOBODY = Holders(is_ours=lambda pid: False, state=lambda pid: None, kill=lambda pid: False)


def health(index: int, **changes: Any) -> GpuHealth:
    fields: dict[str, Any] = {
        "volatile_dbe": 0,
        "remap_pending": False,
        "remap_failed": False,
        "persistence_on": True,
        "fabric": FabricState.NOT_SUPPORTED,
    }
    fields.update(changes)
    return GpuHealth(index=index, uuid=f"GPU-{index}", **fields)


class SickGpus:
    """Four idle GPUs in two NVLink pairs; `pending` GPUs have a row remap until reset."""

    def __init__(self, clock: FakeClock, *pending: int, lost: tuple[int, ...] = ()) -> None:
        self.pending = set(pending)
        self.lost = set(lost)
        self.holders: dict[int, tuple[int, ...]] = {}
        self.sensor = ScriptedGpus(clock, self.memory, self.health)

    def memory(self, _now: float) -> Any:
        return tuple(gpu(i, 0, *self.holders.get(i, ())) for i in range(4) if i not in self.lost)

    def health(self, _now: float) -> HealthSnapshot:
        return HealthSnapshot(
            gpus=tuple(
                GpuHealth(index=i, uuid="", lost=True)
                if i in self.lost
                else health(i, remap_pending=i in self.pending)
                for i in range(4)
            ),
            nvlink=((0, 1), (2, 3)),
        )

    def reset(self, index: int) -> None:
        self.pending.discard(index)


def release(
    sick: SickGpus,
    clock: FakeClock,
    resetter: RecordingResetter | None,
    rules: HealthRules = ENFORCE,
    *,
    targets: tuple[int, ...] = (0, 1),
    reset: tuple[int, ...] = (),
    holders: Holders = NOBODY,
) -> ReleaseResult:
    return wait_for_gpu_release(
        sick.sensor,
        targets,
        (),
        clock=clock,
        holders=holders,
        resetter=resetter,
        limits=ReleaseLimits(timeout_s=60.0, reset_settle_s=2.0),
        health=rules,
        reset=reset,
    )


def test_a_gpu_that_needs_a_reset_is_reset_then_checked_again():
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock, 1)
    resetter = RecordingResetter(on_reset=sick.reset)
    with capture_logs() as logs:
        result = release(sick, clock, resetter)
    assert result.ok, result.reason
    assert resetter.calls == [(1, "GPU-1")]
    assert resetter.sets == [()]  # per GPU: no {indices} in the command
    assert result.reset_gpus == (1,)
    assert sick.sensor.closed == 1, "NVML let go of before the reset"
    assert [g["verdict"] for g in result.health] == ["ok", "ok"]
    started = [e for e in logs if e["event"] == "gpu_reset_started"]
    assert [(e["gpu"], e["gpus"]) for e in started] == [(1, [1])]


def test_with_indices_the_whole_nvlink_peer_set_is_reset_in_one_command():
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock, 1)

    def reset_set(index: int) -> None:
        sick.pending.difference_update({0, 1})

    resetter = RecordingResetter(on_reset=reset_set)
    rules = dataclasses.replace(ENFORCE, peer_sets=True)
    result = release(sick, clock, resetter, rules, targets=(1,))
    assert result.ok, result.reason
    assert resetter.calls == [(1, "GPU-1")]
    assert resetter.sets == [(0, 1)]
    assert result.reset_gpus == (0, 1)  # the peer was reset with it


def test_a_process_on_a_peer_stops_the_reset_no_relaunch():
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock, 1)
    sick.holders[0] = (4242,)  # another user's job on GPU 0, NVLink peer of our GPU 1
    resetter = RecordingResetter(on_reset=sick.reset)
    alive = Holders(is_ours=lambda pid: False, state=lambda pid: "S", kill=lambda pid: False)
    rules = dataclasses.replace(ENFORCE, peer_sets=True)
    result = release(sick, clock, resetter, rules, targets=(1,), holders=alive)
    assert not result.ok
    assert resetter.calls == []
    assert "GPU 0 (an NVLink peer, reset with them) has running processes 4242" in result.reason
    assert result.health, "the incident gets the readings"


def test_a_gpu_the_driver_asked_to_reset_is_reset_even_when_healthy():
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock)
    resetter = RecordingResetter()
    result = release(sick, clock, resetter, HealthRules(mode="off"), reset=(0,))
    assert result.ok
    assert resetter.calls == [(0, "GPU-0")]


def test_a_lost_gpu_is_never_reset_and_ends_the_wait_at_once_with_reboot_needed():
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock, lost=(1,))
    resetter = RecordingResetter()
    result = release(sick, clock, resetter, reset=(1,))
    assert not result.ok
    assert resetter.calls == []
    assert "GPU 1 is lost" in result.reason
    assert "reboot needed" in result.reason
    assert result.elapsed_s < 1.0, "no wait for the timeout: nothing can bring it back"


def test_a_gpu_still_sick_after_its_reset_ends_the_wait():
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock, 1)
    resetter = RecordingResetter()  # the reset "succeeds", the remap stays pending
    result = release(sick, clock, resetter)
    assert not result.ok
    assert resetter.calls == [(1, "GPU-1")]
    assert result.reason.startswith("still failing its health check after a reset: GPU 1")
    assert result.elapsed_s >= 2.0, "given its settle time first"
    with pytest.raises(GpuUnrecoverable):
        raise_if_unrecoverable(result)


@pytest.mark.parametrize(
    ("rules", "resetter"),
    [
        (HealthRules(mode="warn", repair=True), RecordingResetter()),
        (HealthRules(mode="off", repair=True), RecordingResetter()),
        (dataclasses.replace(ENFORCE, repair=False), RecordingResetter()),
        (ENFORCE, None),
    ],
)
def test_otherwise_a_sick_gpu_is_left_to_the_launch_gate(rules, resetter):
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock, 1)
    result = release(sick, clock, resetter, rules)
    assert result.ok
    assert resetter is None or resetter.calls == []
    if rules.mode == "off":
        assert sick.sensor.health_reads == 0, "off reads no health at all"


def _gpu_release(tmp_path: Path, sick: SickGpus, resetter: RecordingResetter) -> GpuRelease:
    return GpuRelease(
        GpuConfig(reset_command="reset {index}", release_timeout_s=60.0),
        [0, 1],
        instance="mine",
        sensor=sick.sensor,
        processes=FakeProcesses(),
        store=StateStore(tmp_path),
        resetter=resetter,
    )


def test_the_runners_wait_resets_for_health_only_after_the_first_launch(tmp_path: Path):
    clock = FakeClock(start_s=0.0)
    sick = SickGpus(clock, 1)
    resetter = RecordingResetter(on_reset=sick.reset)
    waits = _gpu_release(tmp_path, sick, resetter)
    waits.wait((), clock)  # leftovers of an earlier run, before the first launch
    assert resetter.calls == []
    waits.measure_baselines(clock)  # right before the first launch
    waits.wait((), clock)  # after a death of ours
    assert resetter.calls == [(1, "GPU-1")]
    assert not sick.pending
