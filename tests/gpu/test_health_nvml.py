"""The GPU health gate against real NVML, read-only (no injection, no reset): every GPU reads as
a GpuHealth (a call the driver lacks is unknown, never an error), the gate judges each one, the
NVLink pairs name real GPUs, and the guarded worker answers "health" the same. Needs an NVIDIA
GPU and driver: `pytest -m gpu tests/gpu`; skipped where NVML does not start."""

from __future__ import annotations

from types import ModuleType

import pytest

from supervisor.adapters.gpu_guard import GuardedGpuSensor
from supervisor.adapters.nvml import NvmlGpuSensor
from supervisor.adapters.nvml_health import health_from_json, health_to_json, read_health
from supervisor.config import GpuConfig
from supervisor.core.checks import Status
from supervisor.core.gpu_health import Verdict, judge_gpus
from supervisor.preflight.health import health_checks

pytestmark = pytest.mark.gpu


def test_every_gpu_reads_and_is_judged(nvml: ModuleType):
    count = nvml.nvmlDeviceGetCount()
    snapshot = read_health(nvml)
    assert [g.index for g in snapshot.gpus] == list(range(count))
    for gpu in snapshot.gpus:
        assert gpu.lost or gpu.uuid.startswith("GPU-")
        assert gpu.volatile_dbe is None or gpu.volatile_dbe >= 0
    for field, reason in snapshot.unknown:
        assert field
        assert reason
    verdicts = judge_gpus(snapshot, range(count))
    assert all(v.verdict in Verdict for v in verdicts)
    assert all(v.describe().startswith(f"GPU {v.index} (") for v in verdicts)
    assert health_from_json(health_to_json(snapshot)) == snapshot


def test_nvlink_pairs_name_real_gpus(nvml: ModuleType):
    count = nvml.nvmlDeviceGetCount()
    nvlink = read_health(nvml).nvlink
    assert nvlink is None or all(0 <= a < b < count for a, b in nvlink)


def test_the_gate_makes_one_check_per_gpu(nvml: ModuleType):
    count = nvml.nvmlDeviceGetCount()
    gate = health_checks(GpuConfig(), NvmlGpuSensor(nvml).read_health(), list(range(count)))
    assert [c.name for c in gate.checks] == [f"gpu_health_{i}" for i in range(count)]
    assert all(c.status in Status for c in gate.checks)


def test_the_guarded_worker_answers_health(nvml: ModuleType):
    guard = GuardedGpuSensor("pynvml", timeout_s=30.0, start_timeout_s=60.0)
    try:
        snapshot = guard.read_health()
    finally:
        guard.close()
    assert snapshot is not None
    assert len(snapshot.gpus) == nvml.nvmlDeviceGetCount()
