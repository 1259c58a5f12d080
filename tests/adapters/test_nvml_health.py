"""adapters.nvml_health: the health read over a pynvml-shaped module (a small stub shaped like
pynvml, then the simulation with injected faults), its JSON, and the sensors that carry it."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from supervisor.adapters import nvml_health
from supervisor.adapters.gpu_guard import GuardedGpuSensor
from supervisor.adapters.nvml import NoGpuSensor, NvmlGpuSensor
from supervisor.core.gpu_health import FabricState, RecoveryAction, judge_gpus
from supervisor.testing import fake_nvml, gpu_faults

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


def raises(code: int) -> Callable[..., Any]:
    def call(*_args: Any) -> Any:
        raise pynvml.NVMLError(code)

    return call


def stub(count: int = 1, **overrides: Any) -> types.ModuleType:
    """A module shaped like pynvml over `count` healthy GPUs (no NVLink); `overrides` replace
    (or, as None, remove) its functions."""
    module = types.ModuleType("stub_pynvml")

    def fabric(_handle: Any, info: Any) -> int:
        info._obj.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        return 0

    def fields(_handle: Any, ids: list[int]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        values[0].nvmlReturn = 0
        values[0].value.uiVal = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        return values

    functions: dict[str, Any] = {
        "NVMLError": pynvml.NVMLError,
        "c_nvmlGpuFabricInfo_t": pynvml.c_nvmlGpuFabricInfo_t,
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda i: ("handle", i),
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h[1]}",
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 0,
        "nvmlDeviceGetRemappedRows": lambda h: (0, 0, 0, 0),
        "nvmlDeviceGetRetiredPagesPendingStatus": raises(NOT_SUPPORTED),  # Ampere and newer
        "nvmlDeviceGetPersistenceMode": lambda h: pynvml.NVML_FEATURE_ENABLED,
        "nvmlDeviceGetGpuFabricInfo": fabric,
        "nvmlDeviceGetFieldValues": fields,
        "nvmlDeviceGetP2PStatus": lambda a, b, index: pynvml.NVML_P2P_STATUS_NOT_SUPPORTED,
    }
    functions.update(overrides)
    for name, value in functions.items():
        if value is not None:
            setattr(module, name, value)
    return module


def test_a_healthy_gpu_reads_as_such_with_the_exact_calls():
    calls: list[tuple[Any, ...]] = []

    def ecc(handle: Any, kind: int, counter: int) -> int:
        calls.append((handle, kind, counter))
        return 0

    snapshot = nvml_health.read_health(stub(nvmlDeviceGetTotalEccErrors=ecc))
    (gpu,) = snapshot.gpus
    assert calls == [
        (("handle", 0), pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    ]
    assert (gpu.index, gpu.uuid, gpu.lost, gpu.reset_required) == (0, "GPU-0", False, False)
    assert (gpu.volatile_dbe, gpu.remap_pending, gpu.remap_failed) == (0, False, False)
    assert gpu.retired_pages_pending is None
    assert gpu.persistence_on is True
    assert gpu.fabric is FabricState.COMPLETED
    assert gpu.recovery_action is RecoveryAction.NONE
    assert snapshot.nvlink == ()
    assert snapshot.unknown == (
        ("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus: Not Supported"),
    )


def test_each_reading_means_what_nvml_says():
    fields_ = pynvml.c_nvmlFieldValue_t * 1

    def action(_h: Any, _ids: list[int]) -> Any:
        values = fields_()
        values[0].value.uiVal = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
        return values

    module = stub(
        nvmlDeviceGetTotalEccErrors=lambda h, k, c: 3,
        nvmlDeviceGetRemappedRows=lambda h: (5, 1, 1, 1),
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: pynvml.NVML_FEATURE_ENABLED,
        nvmlDeviceGetPersistenceMode=lambda h: pynvml.NVML_FEATURE_DISABLED,
        nvmlDeviceGetFieldValues=action,
    )
    (gpu,) = nvml_health.read_health(module).gpus
    assert gpu.volatile_dbe == 3
    assert (gpu.remap_pending, gpu.remap_failed, gpu.retired_pages_pending) == (True, True, True)
    assert gpu.persistence_on is False
    assert gpu.recovery_action is RecoveryAction.GPU_RESET


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("nvmlDeviceGetTotalEccErrors", raises(NOT_SUPPORTED)),  # ECC off
        ("nvmlDeviceGetTotalEccErrors", raises(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)),
        ("nvmlDeviceGetTotalEccErrors", None),  # an old pynvml without the call
        ("nvmlDeviceGetRemappedRows", raises(NOT_SUPPORTED)),
        ("nvmlDeviceGetPersistenceMode", raises(pynvml.NVML_ERROR_UNKNOWN)),
        ("nvmlDeviceGetFieldValues", None),
    ],
)
def test_a_call_the_driver_lacks_leaves_its_field_unknown_and_names_why(name, value):
    snapshot = nvml_health.read_health(stub(**{name: value}))
    field = {
        "nvmlDeviceGetTotalEccErrors": "volatile_dbe",
        "nvmlDeviceGetRemappedRows": "remapped_rows",
        "nvmlDeviceGetPersistenceMode": "persistence",
        "nvmlDeviceGetFieldValues": "recovery_action",
    }[name]
    reasons = dict(snapshot.unknown)
    assert name in reasons[field]
    gpu = snapshot.gpus[0]
    assert not gpu.lost
    assert not gpu.reset_required


def test_a_field_value_the_driver_does_not_support_is_unknown():
    def unsupported(_h: Any, ids: list[int]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        values[0].nvmlReturn = NOT_SUPPORTED
        return values

    snapshot = nvml_health.read_health(stub(nvmlDeviceGetFieldValues=unsupported))
    assert snapshot.gpus[0].recovery_action is None
    assert "recovery_action" in dict(snapshot.unknown)


def test_no_fabric_is_an_answer_not_a_gap():
    snapshot = nvml_health.read_health(stub(nvmlDeviceGetGpuFabricInfo=raises(NOT_SUPPORTED)))
    assert snapshot.gpus[0].fabric is FabricState.NOT_SUPPORTED
    assert "fabric" not in dict(snapshot.unknown)
    older = nvml_health.read_health(stub(nvmlDeviceGetGpuFabricInfo=None))
    assert older.gpus[0].fabric is None
    assert "fabric" in dict(older.unknown)


def test_gpu_is_lost_or_reset_required_on_any_call_marks_that_gpu_only():
    lost = raises(pynvml.NVML_ERROR_GPU_IS_LOST)
    required = raises(pynvml.NVML_ERROR_RESET_REQUIRED)
    module = stub(
        3,
        nvmlDeviceGetHandleByIndex=lambda i: lost() if i == 2 else ("handle", i),
        nvmlDeviceGetRemappedRows=lambda h: required() if h[1] == 1 else (0, 0, 0, 0),
    )
    snapshot = nvml_health.read_health(module)
    assert [(g.lost, g.reset_required) for g in snapshot.gpus] == [
        (False, False),
        (False, True),
        (True, False),
    ]
    assert snapshot.gpus[1].remap_pending is None
    assert "remapped_rows" not in dict(snapshot.unknown)  # known: it needs a reset
    assert snapshot.nvlink == ()  # the lost GPU is left out of the pairs


def test_nvlink_pairs_come_from_p2p_over_nvlink():
    asked: list[int] = []

    def p2p(a: Any, b: Any, index: int) -> Any:
        asked.append(index)
        linked = {a[1], b[1]} in ({0, 1}, {2, 3})
        return pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    snapshot = nvml_health.read_health(stub(4, nvmlDeviceGetP2PStatus=p2p))
    assert snapshot.nvlink == ((0, 1), (2, 3))
    assert set(asked) == {pynvml.NVML_P2P_CAPS_INDEX_NVLINK}
    failing = nvml_health.read_health(stub(2, nvmlDeviceGetP2PStatus=raises(NOT_SUPPORTED)))
    assert failing.nvlink is None
    assert "nvlink" in dict(failing.unknown)


def test_the_health_read_survives_its_json():
    module = stub(2, nvmlDeviceGetRemappedRows=lambda h: (0, 0, 1, 0))
    snapshot = nvml_health.read_health(module)
    wire = json.loads(json.dumps(nvml_health.health_to_json(snapshot)))
    assert nvml_health.health_from_json(wire) == snapshot
    assert nvml_health.health_from_json(None) is None
    with pytest.raises(KeyError):
        nvml_health.health_from_json({"gpus": []})


# -- the simulation: the same read over fake_nvml with injected faults ----------------------


@pytest.fixture
def sim(make_gpu_state: Callable[..., Path]) -> Iterator[Path]:
    directory = make_gpu_state(4, nvlink_peers=2)
    fake_nvml.set_state_dir(directory)
    yield directory
    fake_nvml.set_state_dir(None)


def inject(directory: Path, fault: str, gpu: int, value: str | None = None) -> None:
    gpu_faults.inject(directory, gpu, fault, value)


def test_the_simulated_gpus_read_healthy_with_their_nvlink_pairs(sim):
    sensor = NvmlGpuSensor(fake_nvml)
    try:
        snapshot = sensor.read_health()
    finally:
        sensor.close()
    assert snapshot is not None
    assert snapshot.nvlink == ((0, 1), (2, 3))
    verdicts = judge_gpus(snapshot, [0, 1, 2, 3])
    assert [v.verdict.value for v in verdicts] == ["ok"] * 4


def test_injected_faults_read_as_the_gate_judges_them(sim):
    inject(sim, "remap-pending", 1)
    inject(sim, "unsupported", 2, "nvmlDeviceGetTotalEccErrors")
    inject(sim, "lost", 3)
    sensor = NvmlGpuSensor(fake_nvml)
    try:
        snapshot = sensor.read_health()
        visible = sensor.read_gpus()
    finally:
        sensor.close()
    assert snapshot is not None
    verdicts = {v.index: v for v in judge_gpus(snapshot, [0, 1, 2, 3])}
    assert verdicts[1].verdict.value == "fail"
    assert "a row remap is pending" in verdicts[1].describe()
    assert verdicts[2].verdict.value == "unknown"
    assert verdicts[2].unknown == ("uncorrectable ECC count",)
    assert verdicts[3].verdict.value == "fail"
    assert verdicts[3].health is not None
    assert verdicts[3].health.lost
    # The lost GPU is left out of the memory read; the others are still read.
    assert visible is not None
    assert [g.index for g in visible] == [0, 1, 2]


def test_no_sensor_means_no_health():
    assert NoGpuSensor().read_health() is None


def test_the_guarded_sensor_reads_health_in_its_worker_and_logs_each_unknown_once(sim):
    inject(sim, "unsupported", 2, "nvmlDeviceGetTotalEccErrors")
    guard = GuardedGpuSensor(
        "supervisor.testing.fake_nvml",
        timeout_s=10,
        start_timeout_s=30,
        env={"FAKE_GPU_STATE_DIR": str(sim)},
    )
    try:
        with capture_logs() as logs:
            first, second = guard.read_health(), guard.read_health()
    finally:
        guard.close()
    assert first is not None
    assert second == first
    assert first.nvlink == ((0, 1), (2, 3))
    assert first.gpus[2].volatile_dbe is None
    unknown = [e for e in logs if e["event"] == "gpu_health_unknown"]
    assert [(e["field"], e["reason"]) for e in unknown] == [
        ("volatile_dbe", "nvmlDeviceGetTotalEccErrors: Not Supported")
    ]
