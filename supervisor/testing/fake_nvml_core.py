"""What every call of the simulated NVML shares: the init count, the state dir, device handles,
and the errors a sick GPU answers with (supervisor/testing/fake_nvml.py is the pynvml surface).

A per-device call names itself to `device()`, which raises as NVML does on that GPU: a lost GPU
NVMLError_GpuIsLost, one needing a reset NVMLError_ResetRequired, a call its simulated driver
lacks NVMLError_NotSupported (gpu_faults.SimHealth.unsupported). Handles stay obtainable for a
lost GPU (real NVML may refuse one too: callers must expect either).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pynvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_RESET_REQUIRED,
    NVML_ERROR_UNINITIALIZED,
    NVMLError,
    NVMLError_DriverNotLoaded,
)

from supervisor.testing import gpu_faults, gpu_state

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


def no_driver(directory: Path | None) -> SimDriverNotLoaded:
    return SimDriverNotLoaded(gpu_state.state_dir_problem(directory) or "no simulated GPUs")


@dataclass(frozen=True, slots=True)
class Handle:
    """Opaque device handle (pynvml returns a ctypes pointer; callers only pass it back)."""

    index: int
    uuid: str


def set_state_dir(path: Path | None) -> None:
    """Use `path` instead of FAKE_GPU_STATE_DIR (not part of pynvml; for the sim adapter)."""
    global _explicit_dir
    _explicit_dir = path


def hang() -> None:
    directory = _state_dir or _explicit_dir or _env_dir()
    if directory is not None:
        hang_s = gpu_state.nvml_hang_s(directory)
        if hang_s > 0:
            time.sleep(hang_s)  # a driver call stuck in D state: the caller must time it out


def _env_dir() -> Path | None:
    value = os.environ.get("FAKE_GPU_STATE_DIR")
    return Path(value) if value else None


def init() -> None:
    """nvmlInit: raises NVMLError_DriverNotLoaded when no state dir is configured or readable."""
    global _refcount, _state_dir
    hang()
    directory = _explicit_dir or _env_dir()
    if gpu_state.state_dir_problem(directory) is not None:
        raise no_driver(directory)
    with _lock:
        _state_dir = directory
        _refcount += 1


def shutdown() -> None:
    global _refcount
    state_dir()
    with _lock:
        _refcount -= 1


def state_dir() -> Path:
    """The state dir of the initialised library (every call starts here: hang, then init check)."""
    hang()
    with _lock:
        if _refcount <= 0 or _state_dir is None:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return _state_dir


def gpus() -> tuple[gpu_state.SimGpu, ...]:
    directory = state_dir()
    try:
        return gpu_state.read_gpus(directory)
    except (OSError, ValueError, KeyError, TypeError):
        raise no_driver(directory) from None  # the state dir went away under a live handle


def gpu(handle: Handle) -> gpu_state.SimGpu:
    if not isinstance(handle, Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for each in gpus():
        if each.uuid == handle.uuid:
            return each
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def device(handle: Handle, call: str) -> tuple[gpu_state.SimGpu, gpu_faults.SimHealth]:
    """The GPU behind `handle` and its health, or the error NVML answers `call` with on it."""
    found = gpu(handle)
    health = gpu_faults.read_health(state_dir(), found.index)
    if health.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if health.reset_required:
        raise NVMLError(NVML_ERROR_RESET_REQUIRED)
    if call in health.unsupported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return found, health
