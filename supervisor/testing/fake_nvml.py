# ruff: noqa: N802, N803 - pynvml's function and parameter names are the contract
"""A stand-in for the `pynvml` module over the simulated GPUs in FAKE_GPU_STATE_DIR.

Same names, argument order and return shapes as nvidia-ml-py for the calls the supervisor makes,
raising the real `pynvml.NVMLError_*` classes with their real codes (the classes are re-exported,
so `except module.NVMLError` works whichever module is in use). A contract test keeps it honest.

No usable state dir (FAKE_GPU_STATE_DIR unset, missing, without gpus.json, or gpus.json gone or
unreadable after nvmlInit) is a host without a driver: `NVMLError_DriverNotLoaded`, value
NVML_ERROR_DRIVER_NOT_LOADED, whose message adds what is wrong and the command that creates
simulated GPUs ("Driver Not Loaded: simulated GPU state dir D holds no gpus.json; create ...").
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
from pynvml import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_UNINITIALIZED,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_InvalidArgument,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    NVMLError_Uninitialized,
    nvmlMemory_v2,
)

from supervisor.testing import gpu_state

__all__ = [
    "NVMLError",
    "NVMLError_DriverNotLoaded",
    "NVMLError_InvalidArgument",
    "NVMLError_NotFound",
    "NVMLError_NotSupported",
    "NVMLError_Uninitialized",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetUUID",
    "nvmlInit",
    "nvmlMemory_v2",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "set_state_dir",
]

# pynvml reports "not available" per-process memory (WDDM, some containers) as None.
_INSTANCE_ID_NONE = 0xFFFFFFFF
DRIVER_VERSION = "570.0 (simulated)"

_lock = threading.Lock()
_refcount = 0
_state_dir: Path | None = None
_explicit_dir: Path | None = None


class SimDriverNotLoaded(NVMLError_DriverNotLoaded):  # type: ignore[misc]  # pynvml is untyped
    """pynvml's DriverNotLoaded (same class tree, same `.value`) with the reason in its message.

    pynvml's own message is only "Driver Not Loaded"; a test bed that is merely misconfigured
    must say so, and how to fix it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"{super().__str__()}: {self.reason}"


def _no_driver(directory: Path | None) -> SimDriverNotLoaded:
    return SimDriverNotLoaded(gpu_state.state_dir_problem(directory) or "no simulated GPUs")


@dataclass(frozen=True, slots=True)
class _Handle:
    """Opaque device handle (pynvml returns a ctypes pointer; callers only pass it back)."""

    index: int
    uuid: str


def set_state_dir(path: Path | None) -> None:
    """Use `path` instead of FAKE_GPU_STATE_DIR (not part of pynvml; for the sim adapter)."""
    global _explicit_dir
    _explicit_dir = path


def _hang() -> None:
    directory = _state_dir or _explicit_dir or _env_dir()
    if directory is not None:
        hang_s = gpu_state.nvml_hang_s(directory)
        if hang_s > 0:
            time.sleep(hang_s)  # a driver call stuck in D state: the caller must time it out


def _env_dir() -> Path | None:
    value = os.environ.get("FAKE_GPU_STATE_DIR")
    return Path(value) if value else None


def _dir() -> Path:
    _hang()
    with _lock:
        if _refcount <= 0 or _state_dir is None:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return _state_dir


def _gpus() -> tuple[gpu_state.SimGpu, ...]:
    directory = _dir()
    try:
        return gpu_state.read_gpus(directory)
    except (OSError, ValueError, KeyError, TypeError):
        raise _no_driver(directory) from None  # the state dir went away under a live handle


def _gpu(handle: _Handle) -> gpu_state.SimGpu:
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for gpu in _gpus():
        if gpu.uuid == handle.uuid:
            return gpu
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlInit() -> None:
    """Raises NVMLError_DriverNotLoaded when no state dir is configured or readable."""
    global _refcount, _state_dir
    _hang()
    directory = _explicit_dir or _env_dir()
    if gpu_state.state_dir_problem(directory) is not None:
        raise _no_driver(directory)
    with _lock:
        _state_dir = directory
        _refcount += 1


def nvmlShutdown() -> None:
    global _refcount
    _dir()
    with _lock:
        _refcount -= 1


def nvmlSystemGetDriverVersion() -> str:
    _dir()
    return DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    for gpu in _gpus():
        if gpu.index == index:
            return _Handle(gpu.index, gpu.uuid)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in _gpus():
        if gpu.uuid == text:
            return _Handle(gpu.index, gpu.uuid)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return _gpu(handle).uuid


def nvmlDeviceGetName(handle: _Handle) -> str:
    return _gpu(handle).name


def _used_bytes(gpu: gpu_state.SimGpu) -> tuple[int, list[gpu_state.SimHolding]]:
    holdings = [h for h in gpu_state.read_holdings(_dir()) if h.gpu_index == gpu.index]
    used = gpu.baseline_used_bytes + sum(h.used_bytes for h in holdings)
    return min(used, gpu.total_bytes), holdings


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> Any:
    """c_nvmlMemory_t (total, free, used), or c_nvmlMemory_v2_t with `version=nvmlMemory_v2`."""
    gpu = _gpu(handle)
    used, _ = _used_bytes(gpu)
    if not version:
        return pynvml.c_nvmlMemory_t(total=gpu.total_bytes, free=gpu.total_bytes - used, used=used)
    return pynvml.c_nvmlMemory_v2_t(
        version=version,
        total=gpu.total_bytes,
        reserved=0,
        free=gpu.total_bytes - used,
        used=used,
    )


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[Any]:
    """Objects with .pid and .usedGpuMemory (bytes), as pynvml's friendly objects."""
    _, holdings = _used_bytes(_gpu(handle))
    return [
        pynvml.nvmlFriendlyObject(
            {
                "pid": h.pid,
                "usedGpuMemory": h.used_bytes,
                "gpuInstanceId": _INSTANCE_ID_NONE,
                "computeInstanceId": _INSTANCE_ID_NONE,
            }
        )
        for h in holdings
        if h.listed
    ]


def nvmlDeviceGetNumaNodeId(handle: _Handle) -> int:
    return _gpu(handle).numa_node


def nvmlDeviceGetMemoryAffinity(handle: _Handle, nodeSetSize: int, scope: int) -> Any:
    """Bitmask array of NUMA nodes near the GPU (one bit: the GPU's node)."""
    node = _gpu(handle).numa_node
    mask = (ctypes.c_ulonglong * nodeSetSize)()
    if node // 64 < nodeSetSize:
        mask[node // 64] = 1 << (node % 64)
    return mask


def nvmlDeviceGetCpuAffinity(handle: _Handle, cpuSetSize: int) -> Any:
    """Bitmask array of the CPUs of the GPU's NUMA node (read from /sys when present)."""
    node = _gpu(handle).numa_node
    mask = (ctypes.c_ulonglong * cpuSetSize)()
    for cpu in _node_cpus(node):
        if cpu // 64 < cpuSetSize:
            mask[cpu // 64] |= 1 << (cpu % 64)
    return mask


def _node_cpus(node: int) -> list[int]:
    try:
        text = Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip()
    except OSError:
        return list(range(os.cpu_count() or 1)) if node == 0 else []
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus
