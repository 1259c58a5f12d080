# ruff: noqa: N802, N803 - pynvml's function and parameter names are the contract
"""The simulated NVML's health calls: row remapping, retired pages, ECC counts, persistence mode,
NVSwitch fabric state and the recovery-action field, over gpu_faults.SimHealth.

Shapes as nvidia-ml-py returns them; each raises what the GPU's state says first (lost, reset
required, not supported: fake_nvml_core.device). Re-exported by supervisor.testing.fake_nvml.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from typing import Any

import pynvml
from pynvml import NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INVALID_ARGUMENT, NVMLError

from supervisor.testing import fake_nvml_core as core
from supervisor.testing.fake_nvml_core import Handle

_RECOVERY_FIELD = "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"
_ECC_COUNTERS = {pynvml.NVML_VOLATILE_ECC: "volatile", pynvml.NVML_AGGREGATE_ECC: "aggregate"}
_ECC_TYPES = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
# A stable fabric (cluster) UUID for the simulated NVSwitch domain.
_CLUSTER_UUID = bytes.fromhex("5a4e0000000040008000f4b21c000001")


def nvmlDeviceGetRemappedRows(device: Handle) -> tuple[int, int, int, int]:
    """(correctable, uncorrectable, pending, failure): rows remapped, a remap waiting for a reset,
    a row that could not be remapped."""
    _, health = core.device(device, "nvmlDeviceGetRemappedRows")
    return health.remapped_rows


def nvmlDeviceGetRetiredPagesPendingStatus(device: Handle) -> int:
    """NVML_FEATURE_ENABLED while a page retirement waits for a reset."""
    _, health = core.device(device, "nvmlDeviceGetRetiredPagesPendingStatus")
    return _feature(health.retired_pages_pending)


def nvmlDeviceGetTotalEccErrors(handle: Handle, errorType: int, counterType: int) -> int:
    """Corrected or uncorrected ECC errors, since the last reset (volatile) or ever (aggregate)."""
    _, health = core.device(handle, "nvmlDeviceGetTotalEccErrors")
    if errorType not in _ECC_TYPES or counterType not in _ECC_COUNTERS:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    corrected, uncorrected = health.ecc[_ECC_COUNTERS[counterType]]
    return uncorrected if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else corrected


def nvmlDeviceGetPersistenceMode(handle: Handle) -> int:
    """NVML_FEATURE_ENABLED or NVML_FEATURE_DISABLED."""
    _, health = core.device(handle, "nvmlDeviceGetPersistenceMode")
    return _feature(health.persistence)


def _feature(on: bool) -> int:
    return int(pynvml.NVML_FEATURE_ENABLED if on else pynvml.NVML_FEATURE_DISABLED)


def _struct(out: Any) -> Any:
    """The structure behind an out-argument: ctypes.byref(s), ctypes.pointer(s), or s itself."""
    if isinstance(out, ctypes.Structure):
        return out
    target = getattr(out, "_obj", None)  # ctypes.byref's CArgObject
    if isinstance(target, ctypes.Structure):
        return target
    with_contents = getattr(out, "contents", None)  # ctypes.pointer
    if isinstance(with_contents, ctypes.Structure):
        return with_contents
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def _fill_fabric(device: Handle, info: Any, call: str) -> int:
    gpu, health = core.device(device, call)
    state = health.fabric_state
    if state is None:
        state = (
            pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
            if gpu.nvswitch
            else pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        )
    completed = state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    info.clusterUuid[:] = list(_CLUSTER_UUID if gpu.nvswitch else bytes(16))
    info.status = pynvml.NVML_SUCCESS  # NVML: to be read only once the state is COMPLETED
    info.cliqueId = 1 if completed else 0
    info.state = state
    if hasattr(info, "healthSummary"):
        info.healthSummary = (
            pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
            if completed
            else pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
        )
    return int(pynvml.NVML_SUCCESS)


def nvmlDeviceGetGpuFabricInfo(device: Handle, gpuFabricInfo: Any) -> int:
    """Fills a c_nvmlGpuFabricInfo_t (pass ctypes.byref(info)); returns NVML_SUCCESS. state:
    COMPLETED on an NVSwitch fabric, NOT_SUPPORTED without one."""
    info = _struct(gpuFabricInfo)
    if not isinstance(info, pynvml.c_nvmlGpuFabricInfo_t):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _fill_fabric(device, info, "nvmlDeviceGetGpuFabricInfo")


def nvmlDeviceGetGpuFabricInfoV(device: Handle, gpuFabricInfo: Any) -> int:
    """As nvmlDeviceGetGpuFabricInfo, for c_nvmlGpuFabricInfo_v2_t / _v3_t with their version."""
    info = _struct(gpuFabricInfo)
    versions = {
        pynvml.c_nvmlGpuFabricInfo_v2_t: pynvml.nvmlGpuFabricInfo_v2,
        pynvml.c_nvmlGpuFabricInfo_v3_t: pynvml.nvmlGpuFabricInfo_v3,
    }
    if versions.get(type(info)) != getattr(info, "version", None):
        raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    return _fill_fabric(device, info, "nvmlDeviceGetGpuFabricInfoV")


def nvmlDeviceGetFieldValues(handle: Handle, fieldIds: Sequence[Any]) -> Any:
    """An array of c_nvmlFieldValue_t, one per field id (or (fieldId, scopeId) pair). Only
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION is simulated (value.uiVal); every other field, and that
    one on a driver without it, has nvmlReturn NVML_ERROR_NOT_SUPPORTED."""
    _, health = core.device(handle, "nvmlDeviceGetFieldValues")
    values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
    now_us = int(time.time() * 1_000_000)
    for value, field_id in zip(values, fieldIds, strict=True):
        try:
            value.fieldId, value.scopeId = field_id
        except TypeError:
            value.fieldId = field_id
        value.timestamp = now_us
        value.latencyUsec = 0
        value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        known = value.fieldId == getattr(pynvml, _RECOVERY_FIELD)
        if known and _RECOVERY_FIELD not in health.unsupported:
            value.nvmlReturn = pynvml.NVML_SUCCESS
            value.value.uiVal = health.recovery_action
        else:
            value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    return values
