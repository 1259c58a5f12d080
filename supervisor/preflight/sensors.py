"""Which GPU sensor a backend name means: real NVML, the simulation's pynvml-shaped module, or
none. The one place the product names the simulation (`sim`), so that adapters never import
supervisor.testing and the simulation is loaded only when asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

# The adapters are imported where a sensor is opened: the pre-flight builds a LazySensor on every
# run but reads it only when the GPU facts are not given, and `run`'s guarded sensor brings
# structlog, ctypes and subprocess with it.
if TYPE_CHECKING:
    from supervisor.adapters.gpu_guard import GuardedGpuSensor
    from supervisor.core.gpu_health import HealthSnapshot
    from supervisor.core.ports import GpuSensor
    from supervisor.core.readings import GpuState

SIM_MODULE = "supervisor.testing.fake_nvml"
BACKENDS = ("auto", "nvml", "sim", "none")


def open_sensor(backend: str) -> GpuSensor:
    """An in-process sensor for a one-shot read (the `preflight` command).

    Raises:
        GpuBackendError: an unknown backend, NVML missing when asked for explicitly, or `sim`
            without simulated GPUs.
    """
    from supervisor.adapters.nvml import GpuBackendError, open_gpu_sensor

    if backend != "sim":
        return open_gpu_sensor(backend)
    try:
        return open_gpu_sensor("nvml", module=importlib.import_module(SIM_MODULE))
    except GpuBackendError:
        raise GpuBackendError(
            "GPU backend sim: no simulated GPUs (set FAKE_GPU_STATE_DIR to a directory made by "
            "supervisor.testing.gpu_state.create_gpus)"
        ) from None


class LazySensor:
    """Opens the backend's sensor at the first read: a pre-flight whose GPU facts are given, or
    that fails on its argv first, never loads NVML."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._sensor: GpuSensor | None = None

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        return self._open().read_gpus()

    def read_health(self) -> HealthSnapshot | None:
        return self._open().read_health()

    def _open(self) -> GpuSensor:
        if self._sensor is None:
            self._sensor = open_sensor(self.backend)
        return self._sensor

    def close(self) -> None:
        if self._sensor is not None:
            self._sensor.close()
            self._sensor = None


def guarded_sensor(
    backend: str,
    *,
    timeout_s: float,
    start_timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    retry_after_s: float | Callable[[int], float] = 30.0,
) -> GuardedGpuSensor:
    """The sensor `run` uses: NVML (`nvml`) or the simulation (`sim`) in a worker process with
    a deadline per query (`start_timeout_s` for the first: the worker's import and nvmlInit),
    left alone `retry_after_s` after a hang (a function of the hangs in a row)."""
    from supervisor.adapters.gpu_guard import START_TIMEOUT_S, GuardedGpuSensor

    module = SIM_MODULE if backend == "sim" else "pynvml"
    start_s = START_TIMEOUT_S if start_timeout_s is None else start_timeout_s
    return GuardedGpuSensor(
        module, timeout_s=timeout_s, start_timeout_s=start_s, env=env, retry_after_s=retry_after_s
    )
