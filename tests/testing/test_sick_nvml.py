"""The simulated NVML's health calls and events, in the real pynvml's shapes, errors and codes."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from supervisor.testing import fake_nvml, gpu_faults, gpu_state

XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError
RECOVERY = pynvml.nvmlEventTypeGpuRecoveryAction


@pytest.fixture
def state(make_gpu_state) -> Path:
    """Four GPUs: 0-1 and 2-3 NVLink peers (reset together), on an NVSwitch fabric."""
    made: Path = make_gpu_state(4, nvlink_peers=2, per_gpu_reset=False, nvswitch=True)
    return made


@pytest.fixture
def nvml(state: Path) -> Iterator[Any]:
    fake_nvml.set_state_dir(state)
    fake_nvml.nvmlInit()
    yield fake_nvml
    fake_nvml.nvmlShutdown()
    fake_nvml.set_state_dir(None)


def _handle(nvml: Any, index: int) -> Any:
    return nvml.nvmlDeviceGetHandleByIndex(index)


def test_a_healthy_gpu_reads_as_pynvml_returns_it(nvml):
    h = _handle(nvml, 1)
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    assert nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == pynvml.NVML_FEATURE_DISABLED
    assert nvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED
    for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
        assert nvml.nvmlDeviceGetTotalEccErrors(h, 1, counter) == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_COUNT, 0)
    (value,) = nvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    assert isinstance(value, pynvml.c_nvmlFieldValue_t)
    assert (value.fieldId, value.nvmlReturn) == (230, pynvml.NVML_SUCCESS)
    assert value.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert value.value.uiVal == pynvml.NVML_GPU_RECOVERY_ACTION_NONE


def test_faults_show_in_the_calls_that_report_them(nvml, state):
    h = _handle(nvml, 1)
    for fault in ("remap-pending", "remap-failed", "retired-pending", "persistence-off", "dbe"):
        gpu_faults.inject(state, 1, fault)
    gpu_faults.inject(state, 1, "recovery-action", "drain-p2p")
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 1)
    assert nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == pynvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_DISABLED
    uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert nvml.nvmlDeviceGetTotalEccErrors(h, uncorrected, pynvml.NVML_VOLATILE_ECC) == 1
    corrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    assert nvml.nvmlDeviceGetTotalEccErrors(h, corrected, pynvml.NVML_VOLATILE_ECC) == 0
    # A (fieldId, scopeId) pair is accepted as pynvml accepts it.
    pair = (pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)
    values = nvml.nvmlDeviceGetFieldValues(h, [pair, pynvml.NVML_FI_DEV_ECC_CURRENT])
    assert values[0].value.uiVal == pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P
    assert values[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # not simulated
    # The other GPUs are untouched.
    assert nvml.nvmlDeviceGetRemappedRows(_handle(nvml, 0)) == (0, 0, 0, 0)


def test_fabric_info_fills_the_struct_passed_by_reference(nvml, state, make_gpu_state):
    h = _handle(nvml, 0)
    info = pynvml.c_nvmlGpuFabricInfo_t()
    assert nvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info)) == pynvml.NVML_SUCCESS
    assert (info.state, info.status) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0)
    v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.pointer(v3))
    assert v3.healthSummary == pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    v3.version = pynvml.nvmlGpuFabricInfo_v2
    with pytest.raises(pynvml.NVMLError) as info_error:
        nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v3))
    assert info_error.value.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    gpu_faults.inject(state, 0, "fabric-incomplete")
    nvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED
    plain = make_gpu_state(1)  # no NVSwitch: nothing to wait for
    fake_nvml.set_state_dir(plain)
    fake_nvml.nvmlInit()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(_handle(nvml, 0), ctypes.byref(info))
        assert info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    finally:
        fake_nvml.nvmlShutdown()
        fake_nvml.set_state_dir(state)


@pytest.mark.parametrize(
    ("fault", "error", "code"),
    [
        ("lost", pynvml.NVMLError_GpuIsLost, pynvml.NVML_ERROR_GPU_IS_LOST),
        ("reset-required", pynvml.NVMLError_ResetRequired, pynvml.NVML_ERROR_RESET_REQUIRED),
    ],
)
def test_a_lost_or_reset_needing_gpu_raises_from_every_call_on_it(nvml, state, fault, error, code):
    h = _handle(nvml, 2)
    gpu_faults.inject(state, 2, fault)
    calls: list[Callable[[], object]] = [
        lambda: nvml.nvmlDeviceGetUUID(h),
        lambda: nvml.nvmlDeviceGetMemoryInfo(h),
        lambda: nvml.nvmlDeviceGetRemappedRows(h),
        lambda: nvml.nvmlDeviceGetFieldValues(h, [230]),
        lambda: nvml.nvmlDeviceRegisterEvents(h, XID, nvml.nvmlEventSetCreate()),
    ]
    for call in calls:
        with pytest.raises(error) as info:
            call()
        assert info.value.value == code
        assert isinstance(info.value, pynvml.NVMLError)
    assert nvml.nvmlDeviceGetUUID(_handle(nvml, 3)) == gpu_state.gpu_uuid(3)


def test_an_unsupported_call_raises_not_supported_and_only_that_one(nvml, state):
    h = _handle(nvml, 0)
    gpu_faults.inject(state, 0, "unsupported", "nvmlDeviceGetRemappedRows")
    gpu_faults.inject(state, 0, "unsupported", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    gpu_faults.inject(state, 0, "unsupported", "nvmlEventTypeGpuRecoveryAction")
    with pytest.raises(pynvml.NVMLError_NotSupported) as info:
        nvml.nvmlDeviceGetRemappedRows(h)
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 0
    (value,) = nvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    assert value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    supported = nvml.nvmlDeviceGetSupportedEventTypes(h)
    assert supported & RECOVERY == 0
    assert supported & XID
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceRegisterEvents(h, XID | RECOVERY, nvml.nvmlEventSetCreate())


def test_nvlink_peers_show_in_the_link_and_p2p_calls(nvml, make_gpu_state):
    h0, h1, h2 = (_handle(nvml, i) for i in range(3))
    assert nvml.nvmlDeviceGetNvLinkState(h0, 0) == pynvml.NVML_FEATURE_ENABLED
    assert nvml.nvmlDeviceGetNvLinkState(h0, 1) == pynvml.NVML_FEATURE_DISABLED
    remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, 0)
    assert isinstance(remote, pynvml.nvmlPciInfo_t)
    assert remote.busId == nvml.nvmlDeviceGetPciInfo(h1).busId == "00000000:28:00.0"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(h0, pynvml.NVML_NVLINK_MAX_LINKS)
    nvlink = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    assert nvml.nvmlDeviceGetP2PStatus(h0, h1, nvlink) == pynvml.NVML_P2P_STATUS_OK
    assert nvml.nvmlDeviceGetP2PStatus(h0, h2, nvlink) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    fake_nvml.set_state_dir(make_gpu_state(2))  # PCIe only
    fake_nvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetNvLinkState(_handle(nvml, 0), 0)
    finally:
        fake_nvml.nvmlShutdown()


def test_pynvml_constants_and_classes_are_forwarded_and_its_other_calls_are_missing():
    for name in ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "nvmlEventTypeXidCriticalError"):
        assert getattr(fake_nvml, name) == getattr(pynvml, name)
    assert fake_nvml.c_nvmlGpuFabricInfo_t is pynvml.c_nvmlGpuFabricInfo_t
    assert fake_nvml.NVMLError_Timeout is pynvml.NVMLError_Timeout
    assert not hasattr(fake_nvml, "nvmlDeviceGetTopologyCommonAncestor")
    fields = [name for name, _ in pynvml.c_nvmlEventData_t._fields_]
    assert list(fake_nvml.SimEventData.__dataclass_fields__) == fields


def _xid_set(nvml: Any, *indices: int, types: int = XID | DBE | RECOVERY) -> Any:
    events = nvml.nvmlEventSetCreate()
    for index in indices:
        nvml.nvmlDeviceRegisterEvents(_handle(nvml, index), types, events)
    return events


def test_each_event_is_delivered_once_in_order_with_its_gpu(nvml, state):
    events = _xid_set(nvml, 0, 1)
    gpu_faults.inject(state, 1, "xid", "48")
    gpu_faults.inject(state, 0, "recovery-action", "gpu-reset")
    gpu_faults.inject(state, 2, "xid", "13")  # not registered
    gpu_faults.inject(state, 0, "dbe")
    got = [nvml.nvmlEventSetWait_v2(events, 1000) for _ in range(3)]
    assert [(nvml.nvmlDeviceGetUUID(e.device), e.eventType, e.eventData) for e in got] == [
        (gpu_state.gpu_uuid(1), XID, 48),
        (gpu_state.gpu_uuid(0), RECOVERY, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET),
        (gpu_state.gpu_uuid(0), DBE, 0),
    ]
    assert got[0].gpuInstanceId == 0xFFFFFFFF
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(events, 0)
    nvml.nvmlEventSetFree(events)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait_v2(events, 0)


def test_every_set_gets_its_own_copy_and_only_the_types_it_registered(nvml, state):
    only_dbe = _xid_set(nvml, 3, types=DBE)
    everything = _xid_set(nvml, 3)
    gpu_faults.inject(state, 3, "xid", "31")
    gpu_faults.inject(state, 3, "dbe")
    assert nvml.nvmlEventSetWait_v2(only_dbe, 1000).eventType == DBE
    assert nvml.nvmlEventSetWait_v2(everything, 1000).eventData == 31
    assert nvml.nvmlEventSetWait_v2(everything, 1000).eventType == DBE


def test_events_before_the_registration_are_not_delivered(nvml, state):
    events = _xid_set(nvml, 0)
    gpu_faults.inject(state, 1, "xid", "31")  # GPU 1 not yet registered
    nvml.nvmlDeviceRegisterEvents(_handle(nvml, 1), XID, events)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(events, 0)
    gpu_faults.inject(state, 1, "xid", "94")
    assert nvml.nvmlEventSetWait_v2(events, 1000).eventData == 94


def test_a_wait_with_nothing_pending_times_out_with_the_real_error(nvml):
    events = _xid_set(nvml, 0)
    began = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout) as info:
        nvml.nvmlEventSetWait_v2(events, 50)
    assert time.monotonic() - began >= 0.05  # it waited, rather than answering at once
    assert info.value.value == pynvml.NVML_ERROR_TIMEOUT
    assert str(info.value) == "Timeout"


def test_a_waiting_set_receives_an_event_injected_by_another_process(nvml, state):
    events = _xid_set(nvml, 2)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(nvml.nvmlEventSetWait_v2(events, 30_000)))
    waiter.start()
    inject = ["inject", "xid", "79", "--gpu", "2", "--dir", str(state)]
    injected = subprocess.run(
        [sys.executable, "-m", "supervisor.testing.fake_gpu", *inject],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    waiter.join(timeout=30)
    assert injected.returncode == 0, injected.stderr
    assert [(e.device, e.eventData) for e in got] == [(_handle(nvml, 2), 79)]
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(_handle(nvml, 2))
