"""The GPU health gate in `run`, told as stories on a fake clock: a sick GPU refuses the first
launch (exit 1) unless --force; the gate runs again before every relaunch; after a death of
ours a GPU that needs a reset is reset (the configured command) and checked before the
relaunch, and without a reset command the relaunch is refused naming the GPU."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.core.events import SignalEvent
from supervisor.core.gpu_health import FabricState, GpuHealth, HealthSnapshot
from supervisor.errors import PreflightFailed
from supervisor.run.gpu_gate import check_before_relaunch, read_gate
from tests.fakes import RecordingResetter, ScriptedGpus
from tests.run.runner_support import LOAD_S, WARM_S, names, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


class Health:
    """Eight GPUs' health on the fake clock; `pending` GPUs have a row remap until reset."""

    def __init__(self) -> None:
        self.pending: set[int] = set()

    def __call__(self, _now: float) -> HealthSnapshot:
        return HealthSnapshot(
            gpus=tuple(
                GpuHealth(
                    index=i,
                    uuid=f"GPU-{i}",
                    volatile_dbe=0,
                    remap_pending=i in self.pending,
                    remap_failed=False,
                    persistence_on=True,
                    fabric=FabricState.NOT_SUPPORTED,
                )
                for i in range(8)
            ),
            nvlink=(),
        )

    def reset(self, index: int) -> None:
        self.pending.discard(index)


def test_a_sick_gpu_refuses_the_first_launch_naming_gpu_and_reason(tmp_path: Path):
    w, health = world(tmp_path), Health()
    health.pending.add(1)
    run = runner(w, settings(tmp_path), health=health)
    with capture_logs() as logs, pytest.raises(PreflightFailed) as err:
        run.run()
    assert err.value.exit_code == 1
    assert str(err.value).startswith("the pre-flight refuses this launch: gpu_health_1 failed")
    assert "GPU 1 (GPU-1): fail: a row remap is pending: needs a reset" in str(err.value)
    assert w.launcher.started == []
    gate = next(e for e in logs if e["event"] == "gpu_health")
    assert gate["log_level"] == "warning"
    assert [(g["gpu"], g["verdict"]) for g in gate["gpus"]] == [(0, "ok"), (1, "fail")]


def test_force_launches_onto_a_sick_gpu_anyway(tmp_path: Path):
    w, health = world(tmp_path), Health()
    health.pending.add(1)
    w.events.at(LOAD_S + WARM_S + 1.0, SIGTERM)
    run = runner(w, settings(tmp_path, force=True), health=health)
    with capture_logs() as logs:
        assert run.run() == 0
    assert len(w.launcher.started) == 1
    assert any(e["event"] == "preflight_failed_forced" for e in logs)


def test_the_gate_runs_again_before_a_relaunch_and_refuses_a_gpu_sick_since(tmp_path: Path):
    w, health = world(tmp_path), Health()

    def crash() -> None:
        health.pending.add(0)  # the crash left a row remap pending
        w.server.crash_rank(0)

    w.events.call_at(LOAD_S + WARM_S + 5.0, crash)
    run = runner(w, settings(tmp_path), health=health)  # no reset command
    with capture_logs() as logs, pytest.raises(PreflightFailed) as err:
        run.run()
    assert str(err.value).startswith("the GPU health gate refuses this relaunch: gpu_health_0")
    assert "reset it (as root, no process on it: nvidia-smi --gpu-reset -i 0" in str(err.value)
    assert len(w.launcher.started) == 1
    fatal = logs[-1]
    assert (fatal["event"], fatal["exit_code"]) == ("fatal", 1)
    assert len([e for e in logs if e["event"] == "gpu_health"]) == 2


def test_after_a_death_a_gpu_that_needs_a_reset_is_reset_then_relaunched(tmp_path: Path):
    w, health = world(tmp_path), Health()
    w.resetter = RecordingResetter(on_reset=health.reset)

    def crash() -> None:
        health.pending.add(0)
        w.server.crash_rank(0)

    w.events.call_at(LOAD_S + WARM_S + 5.0, crash)
    w.events.at(100.0, SIGTERM)
    run = runner(w, settings(tmp_path), health=health)
    with capture_logs() as logs:
        assert run.run() == 0
    assert w.resetter.calls == [(0, "GPU-0")]
    assert len(w.launcher.started) == 2
    assert names(logs).count("launching") == 2
    gates = [e for e in logs if e["event"] == "gpu_health"]
    assert [g["gpus"][0]["verdict"] for g in gates] == ["ok", "ok"]


def test_the_relaunch_gate_alone(tmp_path: Path):
    health = Health()
    health.pending.add(1)
    sensor = ScriptedGpus(world(tmp_path).clock, lambda _t: (), health)
    with pytest.raises(PreflightFailed):
        check_before_relaunch(settings(tmp_path), [0, 1], sensor)
    check_before_relaunch(settings(tmp_path, force=True), [0, 1], sensor)
    check_before_relaunch(settings(tmp_path), [0, 1], None)  # no GPU watched: nothing to do
    with capture_logs() as logs:
        assert read_gate(settings(tmp_path), [0], sensor).failed == ()
    assert logs[0]["log_level"] == "info"
