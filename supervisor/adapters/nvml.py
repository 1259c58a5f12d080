"""GpuSensor over NVML: the real `pynvml`, a pynvml-shaped module the caller hands in (the
simulation), or nothing.

Thin and in-process: one read = count, handles, UUID, name, memory, compute processes, NUMA node;
the health read is adapters/nvml_health.py's. Callers that must survive a hung driver run it in a
worker process with a timeout (adapters/gpu_guard.py). This module never names the simulation:
the shell passes its module.
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any

from supervisor.adapters.nvml_health import read_health
from supervisor.core.gpu_health import HealthSnapshot
from supervisor.core.ports import GpuSensor
from supervisor.core.readings import GpuProcess, GpuState
from supervisor.errors import ConfigError

BACKENDS = ("auto", "nvml", "none")
# nvml.h: a GPU fallen off the bus, or one waiting for a reset, fails every call of its own.
_GPU_GONE = (15, 16)  # NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED


class GpuBackendError(ConfigError):
    """The requested GPU backend cannot be used (unknown name, or NVML failed to start): exit 2."""


class NoGpuSensor:
    """`none`: the GPUs are not watched; every read says "unknown"."""

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        return None

    def read_health(self) -> HealthSnapshot | None:
        return None

    def close(self) -> None:
        pass


class NvmlGpuSensor:
    """Reads GPUs through a pynvml-shaped module (the real one or supervisor.testing.fake_nvml)."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        nvml.nvmlInit()
        self._open = True

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        """Every GPU that answers, or None when NVML fails mid-read (driver gone).

        A GPU that is lost or waits for a reset is left out, the others read: the health read
        says what is wrong with it, and the release wait and pre-flight see it missing.
        """
        nvml = self._nvml
        gpus = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    gpus.append(self._read_one(nvml, handle, index))
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) not in _GPU_GONE:
                        raise
        except nvml.NVMLError:
            return None
        return tuple(gpus)

    def read_health(self) -> HealthSnapshot | None:
        """Every GPU's health (adapters/nvml_health.py), None when NVML fails to count them."""
        try:
            return read_health(self._nvml)
        except self._nvml.NVMLError:
            return None

    @staticmethod
    def _read_one(nvml: ModuleType, handle: Any, index: int) -> GpuState:
        try:
            # v2 separates driver-reserved memory from `used` (driver >= 515, docs/peers.md).
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        except nvml.NVMLError:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        processes = tuple(
            GpuProcess(
                pid=int(p.pid), used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory)
            )
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        )
        try:
            numa: int | None = int(nvml.nvmlDeviceGetNumaNodeId(handle))
        except nvml.NVMLError:
            numa = None  # older drivers and single-node machines report NotSupported
        if numa is not None and numa < 0:
            numa = None
        return GpuState(
            index=index,
            uuid=str(nvml.nvmlDeviceGetUUID(handle)),
            name=str(nvml.nvmlDeviceGetName(handle)),
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            processes=processes,
            numa_node=numa,
        )

    def close(self) -> None:
        if self._open:
            self._open = False
            # An NVMLError here means there is nothing left to release.
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()


def _load_pynvml() -> ModuleType:
    return importlib.import_module("pynvml")


def open_gpu_sensor(backend: str, *, module: ModuleType | None = None) -> GpuSensor:
    """Open the GPU sensor for `backend`: nvml | none | auto, over `module` (default pynvml).

    auto = nvml when the library loads and nvmlInit succeeds, else none.

    Raises:
        GpuBackendError: unknown backend; nvml chosen explicitly but the driver or
            libnvidia-ml.so is missing (likely no NVIDIA driver on this host).
    """
    if backend not in BACKENDS:
        raise GpuBackendError(f"unknown GPU backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "none":
        return NoGpuSensor()
    try:
        return NvmlGpuSensor(module or _load_pynvml())
    except Exception as exc:  # noqa: BLE001 - ImportError or any NVMLError: no usable NVML
        if backend == "auto":
            return NoGpuSensor()
        raise GpuBackendError(
            f"GPU backend nvml: NVML did not start ({exc}); is the NVIDIA driver installed?"
        ) from None
