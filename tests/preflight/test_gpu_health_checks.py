"""The GPU health gate as pre-flight checks: one `gpu_health_<index>` per target GPU in the
table and the --json `checks`, by `[gpu] health`; a sick GPU is a no-fit (exit 1) naming the GPU,
its UUID, the reason and the reset; an unsupported call is unknown, never a failure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import GpuConfig
from supervisor.core.checks import Status
from supervisor.core.gpu_health import FabricState, GpuHealth, HealthSnapshot
from supervisor.preflight.health import NOT_READ, health_checks, read_health_gate
from supervisor.testing import gpu_faults
from tests.preflight.support import LLAMA, run, run_json

HEALTHY = {
    "volatile_dbe": 0,
    "remap_pending": False,
    "remap_failed": False,
    "persistence_on": True,
    "fabric": FabricState.NOT_SUPPORTED,
}


def snapshot(**sick: Any) -> HealthSnapshot:
    """GPUs 0-3 in two NVLink pairs; GPU 1 with `sick` readings."""
    gpus = tuple(
        GpuHealth(index=i, uuid=f"GPU-{i}", **{**HEALTHY, **(sick if i == 1 else {})})
        for i in range(4)
    )
    return HealthSnapshot(gpus=gpus, nvlink=((0, 1), (2, 3)))


def test_each_target_gpu_is_one_check_with_its_uuid_and_verdict():
    gate = health_checks(GpuConfig(), snapshot(remap_pending=True), [0, 1])
    assert [(c.name, c.status) for c in gate.checks] == [
        ("gpu_health_0", Status.OK),
        ("gpu_health_1", Status.FAIL),
    ]
    assert gate.checks[1].detail.startswith(
        "GPU 1 (GPU-1): fail: a row remap is pending: needs a reset; reset it (as root"
    )
    assert [c.name for c in gate.failed] == ["gpu_health_1"]
    event = gate.event()
    assert event["mode"] == "enforce"
    assert [g["verdict"] for g in event["gpus"]] == ["ok", "fail"]
    assert event["failed"] == ["gpu_health_1"]


def test_a_configured_reset_command_is_offered_filled_in_for_the_peer_set():
    gpu = GpuConfig(reset_command="/opt/hook --token=hunter2secret -i {indices}")
    (_, sick) = health_checks(gpu, snapshot(remap_pending=True), [0, 1]).checks
    assert "reset it: /opt/hook --token=*** -i 0,1 (gpu reset_command)" in sick.detail
    assert "hunter2secret" not in sick.detail
    per_gpu = GpuConfig(reset_command="nvidia-smi --gpu-reset -i {index}")
    (_, sick) = health_checks(per_gpu, snapshot(remap_pending=True), [0, 1]).checks
    assert "reset it: nvidia-smi --gpu-reset -i 1 (gpu reset_command), or reboot" in sick.detail


def test_a_lost_gpu_is_offered_no_reset():
    (_, lost) = health_checks(GpuConfig(), snapshot(lost=True), [0, 1]).checks
    assert lost.status is Status.FAIL
    assert "reset it" not in lost.detail
    assert lost.detail.endswith("reboot the node")


def test_warn_mode_reports_failures_as_warnings_and_off_reads_nothing():
    warned = health_checks(GpuConfig(health="warn"), snapshot(remap_pending=True), [1])
    assert [c.status for c in warned.checks] == [Status.WARN]
    assert "fail: a row remap is pending" in warned.checks[0].detail
    assert warned.failed == ()
    asked: list[str] = []

    class Sensor:
        def read_health(self) -> HealthSnapshot:
            asked.append("health")
            return snapshot()

    off = read_health_gate(GpuConfig(health="off"), [1], Sensor())  # type: ignore[arg-type]
    assert off.checks == ()
    assert asked == []


def test_no_health_reading_is_one_warning_never_a_failure():
    gate = health_checks(GpuConfig(), None, [0, 1])
    assert [(c.name, c.status, c.detail) for c in gate.checks] == [
        ("gpu_health", Status.WARN, NOT_READ)
    ]


# -- `sglang-supervisor preflight` on simulated GPUs ---------------------------------------

ARGS = ["--model-path", "m", "--tp-size", "2"]
FACTS = ["--mem-available", "445GB", "--weights", "10GB", "--model-config", str(LLAMA)]


@pytest.fixture
def gpus(make_gpu_state: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = make_gpu_state(2)
    monkeypatch.setenv("FAKE_GPU_STATE_DIR", str(directory))
    return directory


def checks_of(data: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in data["checks"]}


def test_healthy_simulated_gpus_pass_the_gate(capsys, gpus):
    code, data = run_json(capsys, *FACTS, "--gpu-backend", "sim", "--", *ARGS)
    assert code == 0
    checks = checks_of(data)
    assert checks["gpu_health_0"]["status"] == "ok"
    assert checks["gpu_health_1"]["detail"].startswith("GPU 1 (GPU-5a4e")


def test_a_pending_remap_is_a_no_fit_naming_the_gpu_and_the_reason(capsys, gpus):
    gpu_faults.inject(gpus, 1, "remap-pending")
    code, data = run_json(capsys, *FACTS, "--gpu-backend", "sim", "--", *ARGS)
    assert code == 1
    assert data["verdict"] == "no-fit"
    sick = checks_of(data)["gpu_health_1"]
    assert sick["status"] == "fail"
    assert "GPU 1 (GPU-" in sick["detail"]
    assert "a row remap is pending: needs a reset" in sick["detail"]
    code, out, _ = run(capsys, "preflight", *FACTS, "--gpu-backend", "sim", "--", *ARGS)
    assert code == 1
    assert "fail  gpu_health_1" in out


def test_an_unsupported_call_reads_unknown_and_never_fails(capsys, gpus):
    gpu_faults.inject(gpus, 0, "unsupported", "nvmlDeviceGetTotalEccErrors")
    code, data = run_json(capsys, *FACTS, "--gpu-backend", "sim", "--", *ARGS)
    assert code == 0
    unknown = checks_of(data)["gpu_health_0"]
    assert unknown["status"] == "warn"
    assert "unknown: not reported: uncorrectable ECC count" in unknown["detail"]


def test_the_gate_can_be_switched_off_or_to_warnings(capsys, gpus, tmp_path: Path):
    gpu_faults.inject(gpus, 1, "remap-pending")
    for mode, code_wanted, status in (("off", 0, None), ("warn", 0, "warn")):
        config = tmp_path / f"{mode}.toml"
        config.write_text(f'[gpu]\nhealth = "{mode}"\n')
        code, data = run_json(
            capsys, "--config", str(config), *FACTS, "--gpu-backend", "sim", "--", *ARGS
        )
        assert code == code_wanted
        assert checks_of(data).get("gpu_health_1", {}).get("status") == status


def test_given_gpu_facts_plan_another_box_so_no_health_is_read(capsys, gpus):
    gpu_faults.inject(gpus, 1, "remap-pending")
    given = [*FACTS, "--gpus", "2", "--gpu-memory", "80GiB"]
    code, data = run_json(capsys, *given, "--gpu-backend", "sim", "--", *ARGS)
    assert code == 0
    assert not [c for c in data["checks"] if c["name"].startswith("gpu_health")]
