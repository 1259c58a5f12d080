# ruff: noqa: N802, N803 - pynvml's function and parameter names are the contract
"""A stand-in for the `pynvml` module over the simulated GPUs in FAKE_GPU_STATE_DIR.

Same names, argument order and return shapes as nvidia-ml-py for the calls the supervisor makes,
raising the real `pynvml.NVMLError_*` classes with their real codes. pynvml's constants, structs
and error classes (NVML_*, nvmlEventType*, c_nvml*, NVMLError*) are pynvml's own, forwarded, so
`except module.NVMLError` and `module.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` work whichever module
is in use. A contract test keeps it honest. Health and ECC calls: fake_nvml_health.py; events:
fake_nvml_events.py; a sick GPU's errors (lost, reset required, not supported): fake_nvml_core.py.

No usable state dir (FAKE_GPU_STATE_DIR unset, missing, without gpus.json, or gpus.json gone or
unreadable after nvmlInit) is a host without a driver: `NVMLError_DriverNotLoaded`, value
NVML_ERROR_DRIVER_NOT_LOADED, whose message adds what is wrong and the command that creates
simulated GPUs ("Driver Not Loaded: simulated GPU state dir D holds no gpus.json; create ...").

NVLink: GPUs of one simulated NVLink group are linked directly, link k of a GPU to its k-th peer
(by index); nvmlDeviceGetP2PStatus answers for P2P over NVLink only. A GPU without NVLink answers
NOT_SUPPORTED to the NVLink calls, as a PCIe-only GPU does.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import pynvml
from pynvml import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_InvalidArgument,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    NVMLError_ResetRequired,
    NVMLError_Timeout,
    NVMLError_Uninitialized,
    nvmlMemory_v2,
)

from supervisor.testing import fake_nvml_core as core
from supervisor.testing import gpu_state
from supervisor.testing.fake_nvml_core import Handle, SimDriverNotLoaded, set_state_dir
from supervisor.testing.fake_nvml_events import (
    SimEventData,
    nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceRegisterEvents,
    nvmlEventSetCreate,
    nvmlEventSetFree,
    nvmlEventSetWait,
    nvmlEventSetWait_v2,
)
from supervisor.testing.fake_nvml_health import (
    nvmlDeviceGetFieldValues,
    nvmlDeviceGetGpuFabricInfo,
    nvmlDeviceGetGpuFabricInfoV,
    nvmlDeviceGetPersistenceMode,
    nvmlDeviceGetRemappedRows,
    nvmlDeviceGetRetiredPagesPendingStatus,
    nvmlDeviceGetTotalEccErrors,
)

__all__ = [
    "NVMLError",
    "NVMLError_DriverNotLoaded",
    "NVMLError_GpuIsLost",
    "NVMLError_InvalidArgument",
    "NVMLError_NotFound",
    "NVMLError_NotSupported",
    "NVMLError_ResetRequired",
    "NVMLError_Timeout",
    "NVMLError_Uninitialized",
    "SimDriverNotLoaded",
    "SimEventData",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetUUID",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlEventSetWait",
    "nvmlEventSetWait_v2",
    "nvmlInit",
    "nvmlMemory_v2",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "set_state_dir",
]

# pynvml reports "not available" per-process memory (WDDM, some containers) as None.
_INSTANCE_ID_NONE = 0xFFFFFFFF
DRIVER_VERSION = "570.0 (simulated)"
_NVLINKS_PER_GPU = 18  # Hopper: 18 NVLink 4 links
_PCI_DEVICE_ID = 0x233510DE  # H200 SXM, vendor NVIDIA
_FORWARDED = ("NVML_", "NVMLError", "nvml", "c_nvml")


def __getattr__(name: str) -> Any:
    """pynvml's constants, structs and error classes, as pynvml defines them; its functions
    stay missing unless simulated here (AttributeError: a call the simulation lacks)."""
    value = getattr(pynvml, name, None)
    is_function = callable(value) and not isinstance(value, type)
    if value is None or not name.startswith(_FORWARDED) or is_function:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return value


def nvmlInit() -> None:
    """Raises NVMLError_DriverNotLoaded when no state dir is configured or readable."""
    core.init()


def nvmlShutdown() -> None:
    core.shutdown()


def nvmlSystemGetDriverVersion() -> str:
    core.state_dir()
    return DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    return len(core.gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
    for gpu in core.gpus():
        if gpu.index == index:
            return Handle(gpu.index, gpu.uuid)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> Handle:
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in core.gpus():
        if gpu.uuid == text:
            return Handle(gpu.index, gpu.uuid)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle: Handle) -> str:
    return core.device(handle, "nvmlDeviceGetUUID")[0].uuid


def nvmlDeviceGetName(handle: Handle) -> str:
    return core.device(handle, "nvmlDeviceGetName")[0].name


def _pci_info(gpu: gpu_state.SimGpu) -> Any:
    bus_id = gpu_state.pci_bus_id(gpu.index)
    return pynvml.nvmlPciInfo_t(
        busIdLegacy=bus_id[4:].encode(),
        domain=0,
        bus=int(bus_id.split(":")[1], 16),
        device=0,
        pciDeviceId=_PCI_DEVICE_ID,
        pciSubSystemId=0,
        busId=bus_id.encode(),
    )


def nvmlDeviceGetPciInfo(handle: Handle) -> Any:
    """nvmlPciInfo_t; busId as nvidia-smi prints it (00000000:18:00.0)."""
    return _pci_info(core.device(handle, "nvmlDeviceGetPciInfo")[0])


def _link_peer(device: Handle, link: int, call: str) -> gpu_state.SimGpu | None:
    """The GPU at the other end of `link` (None: an inactive link)."""
    gpu, _ = core.device(device, call)
    if gpu.nvlink_group is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= link < _NVLINKS_PER_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    peers = gpu_state.nvlink_peers(core.gpus(), gpu)
    return peers[link] if link < len(peers) else None


def nvmlDeviceGetNvLinkState(device: Handle, link: int) -> int:
    """NVML_FEATURE_ENABLED for a link to a peer, NVML_FEATURE_DISABLED for an unused one."""
    active = _link_peer(device, link, "nvmlDeviceGetNvLinkState") is not None
    return int(pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED)


def nvmlDeviceGetNvLinkRemotePciInfo(device: Handle, link: int) -> Any:
    """The peer GPU's nvmlPciInfo_t; an inactive link is an invalid argument."""
    peer = _link_peer(device, link, "nvmlDeviceGetNvLinkRemotePciInfo")
    if peer is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _pci_info(peer)


def nvmlDeviceGetP2PStatus(device1: Handle, device2: Handle, p2pIndex: int) -> int:
    """NVML_P2P_STATUS_OK between NVLink peers, NVML_P2P_STATUS_NOT_SUPPORTED otherwise."""
    first, _ = core.device(device1, "nvmlDeviceGetP2PStatus")
    second, _ = core.device(device2, "nvmlDeviceGetP2PStatus")
    if p2pIndex not in (0, 1, 2, 3, 4):  # READ, WRITE, NVLINK, ATOMICS, PCI
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    linked = first.nvlink_group is not None and first.nvlink_group == second.nvlink_group
    return int(pynvml.NVML_P2P_STATUS_OK if linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)


def _used_bytes(gpu: gpu_state.SimGpu) -> tuple[int, list[gpu_state.SimHolding]]:
    holdings = [h for h in gpu_state.read_holdings(core.state_dir()) if h.gpu_index == gpu.index]
    used = gpu.baseline_used_bytes + sum(h.used_bytes for h in holdings)
    return min(used, gpu.total_bytes), holdings


def nvmlDeviceGetMemoryInfo(handle: Handle, version: int | None = None) -> Any:
    """c_nvmlMemory_t (total, free, used), or c_nvmlMemory_v2_t with `version=nvmlMemory_v2`."""
    gpu, _ = core.device(handle, "nvmlDeviceGetMemoryInfo")
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


def nvmlDeviceGetComputeRunningProcesses(handle: Handle) -> list[Any]:
    """Objects with .pid and .usedGpuMemory (bytes), as pynvml's friendly objects."""
    gpu, _ = core.device(handle, "nvmlDeviceGetComputeRunningProcesses")
    _, holdings = _used_bytes(gpu)
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


def nvmlDeviceGetNumaNodeId(handle: Handle) -> int:
    return core.device(handle, "nvmlDeviceGetNumaNodeId")[0].numa_node


def nvmlDeviceGetMemoryAffinity(handle: Handle, nodeSetSize: int, scope: int) -> Any:
    """Bitmask array of NUMA nodes near the GPU (one bit: the GPU's node)."""
    node = core.device(handle, "nvmlDeviceGetMemoryAffinity")[0].numa_node
    mask = (ctypes.c_ulonglong * nodeSetSize)()
    if node // 64 < nodeSetSize:
        mask[node // 64] = 1 << (node % 64)
    return mask


def nvmlDeviceGetCpuAffinity(handle: Handle, cpuSetSize: int) -> Any:
    """Bitmask array of the CPUs of the GPU's NUMA node (read from /sys when present)."""
    node = core.device(handle, "nvmlDeviceGetCpuAffinity")[0].numa_node
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
