"""Every GPU's health through a pynvml-shaped module (core.gpu_health.HealthSnapshot), and its
JSON on the GPU worker's pipe (adapters/gpu_guard.py). Runs inside the worker: it never logs.

The calls, as nvidia-ml-py names and shapes them (the simulation implements the same):

    nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC) -> int
    nvmlDeviceGetRemappedRows(h) -> (correctable, uncorrectable, pending, failure)
    nvmlDeviceGetRetiredPagesPendingStatus(h) -> NVML_FEATURE_ENABLED when pending
    nvmlDeviceGetPersistenceMode(h) -> NVML_FEATURE_ENABLED / DISABLED
    nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(module.c_nvmlGpuFabricInfo_t())) fills `.state`
    nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]: .nvmlReturn, .value.uiVal
    nvmlDeviceGetP2PStatus(h1, h2, NVML_P2P_CAPS_INDEX_NVLINK) -> NVML_P2P_STATUS_OK: NVLink peers

A call that raises NotSupported, FunctionNotFound or any other NVMLError, or that this pynvml
lacks (AttributeError), leaves its field None and names it in `unknown` with the reason;
GPU_IS_LOST or RESET_REQUIRED from any call on a GPU marks that GPU lost / reset_required. The
fabric call's NotSupported is an answer, not a gap: NVML has no fabric for that GPU (pre-Hopper,
or no NVSwitch), which is what the state NOT_SUPPORTED says too.

NVLink peers: nvidia-smi resets NVLink-connected GPUs together where the GPUs cannot be reset
alone; P2P over NVLink is what NVML reports per pair on both direct-NVLink and NVSwitch boxes.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from supervisor.core.gpu_health import FabricState, GpuHealth, HealthSnapshot, RecoveryAction

# nvml.h's values (a stable ABI): a pynvml-shaped module need not export them.
_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
_RESET_REQUIRED = 16  # NVML_ERROR_RESET_REQUIRED
_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
_VOLATILE = 0  # NVML_VOLATILE_ECC
_ENABLED = 1  # NVML_FEATURE_ENABLED
_RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
_P2P_NVLINK = 2  # NVML_P2P_CAPS_INDEX_NVLINK
_P2P_OK = 0  # NVML_P2P_STATUS_OK


class _Calls:
    """NVML calls on one module; each failure noted once per field (first reason kept)."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.unknown: dict[str, str] = {}

    def call(
        self,
        field: str,
        name: str,
        *args: Any,
        on_code: Callable[[int], None],
        answers: frozenset[int] = frozenset(),
    ) -> Any:
        """`name(*args)`, or None: the field unknown. `on_code` hears every NVML error code;
        codes in `answers` are answers, not gaps (never noted as unknown)."""
        function = getattr(self.nvml, name, None)
        if function is None:
            self.unknown.setdefault(field, f"{name} is missing from this pynvml (old driver)")
            return None
        try:
            return function(*args)
        except self.nvml.NVMLError as exc:
            code = int(getattr(exc, "value", -1))
            on_code(code)
            # Lost and reset-required are known states of the GPU, not gaps in what is known.
            if code not in (_GPU_IS_LOST, _RESET_REQUIRED, *answers):
                self.unknown.setdefault(field, f"{name}: {exc}")
            return None


class _Gpu:
    """One GPU's readings as they come in."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lost = False
        self.reset_required = False

    def heard(self, code: int) -> None:
        if code == _GPU_IS_LOST:
            self.lost = True
        elif code == _RESET_REQUIRED:
            self.reset_required = True


def _fabric(calls: _Calls, handle: Any, gpu: _Gpu) -> FabricState | None:
    name = "nvmlDeviceGetGpuFabricInfo"
    struct = getattr(calls.nvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is None or not hasattr(calls.nvml, name):
        calls.unknown.setdefault("fabric", f"{name} is missing from this pynvml (old driver)")
        return None
    info = struct()
    codes: list[int] = []

    def heard(code: int) -> None:
        codes.append(code)
        gpu.heard(code)

    not_supported = frozenset({_NOT_SUPPORTED})
    calls.call("fabric", name, handle, ctypes.byref(info), on_code=heard, answers=not_supported)
    if codes:
        return FabricState.NOT_SUPPORTED if codes == [_NOT_SUPPORTED] else None
    try:
        return FabricState(int(info.state))
    except ValueError:
        calls.unknown.setdefault("fabric", f"{name}: unknown fabric state {info.state}")
        return None


def _recovery_action(calls: _Calls, handle: Any, gpu: _Gpu) -> RecoveryAction | None:
    name = "nvmlDeviceGetFieldValues"
    values = calls.call(
        "recovery_action", name, handle, [_RECOVERY_ACTION_FIELD], on_code=gpu.heard
    )
    if values is None:
        return None
    value = values[0]
    code = int(value.nvmlReturn)
    if code != 0:
        gpu.heard(code)
        if code not in (_GPU_IS_LOST, _RESET_REQUIRED):
            calls.unknown.setdefault("recovery_action", f"{name}: NVML error {code}")
        return None
    try:
        return RecoveryAction(int(value.value.uiVal))
    except ValueError:
        calls.unknown.setdefault("recovery_action", f"unknown action {value.value.uiVal}")
        return None


def _flag(value: Any, read: Callable[[Any], bool]) -> bool | None:
    return None if value is None else read(value)


def _read_gpu(calls: _Calls, index: int) -> tuple[GpuHealth, Any]:
    """One GPU's health and its handle (None when even the handle failed)."""
    gpu = _Gpu(index)
    handle = calls.call("handle", "nvmlDeviceGetHandleByIndex", index, on_code=gpu.heard)
    if handle is None:
        return GpuHealth(
            index=index, uuid="", lost=gpu.lost, reset_required=gpu.reset_required
        ), None
    uuid = calls.call("uuid", "nvmlDeviceGetUUID", handle, on_code=gpu.heard)
    if gpu.lost:  # every further call would say the same, each after the driver's own timeout
        return GpuHealth(index=index, uuid="" if uuid is None else str(uuid), lost=True), None
    dbe = calls.call(
        "volatile_dbe",
        "nvmlDeviceGetTotalEccErrors",
        handle,
        _UNCORRECTED,
        _VOLATILE,
        on_code=gpu.heard,
    )
    rows = calls.call("remapped_rows", "nvmlDeviceGetRemappedRows", handle, on_code=gpu.heard)
    retired = calls.call(
        "retired_pages_pending",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        handle,
        on_code=gpu.heard,
    )
    persistence = calls.call(
        "persistence", "nvmlDeviceGetPersistenceMode", handle, on_code=gpu.heard
    )
    fabric = _fabric(calls, handle, gpu)
    action = _recovery_action(calls, handle, gpu)
    health = GpuHealth(
        index=index,
        uuid="" if uuid is None else str(uuid),
        lost=gpu.lost,
        reset_required=gpu.reset_required,
        volatile_dbe=None if dbe is None else int(dbe),
        remap_pending=_flag(rows, lambda r: bool(r[2])),
        remap_failed=_flag(rows, lambda r: bool(r[3])),
        retired_pages_pending=_flag(retired, lambda v: int(v) == _ENABLED),
        persistence_on=_flag(persistence, lambda v: int(v) == _ENABLED),
        fabric=fabric,
        recovery_action=action,
    )
    return health, (None if gpu.lost else handle)


def _nvlink(calls: _Calls, handles: dict[int, Any]) -> tuple[tuple[int, int], ...] | None:
    """Pairs of GPUs NVML reports NVLink peer-to-peer between; None when it cannot say."""
    pairs = []
    for (a, ha), (b, hb) in itertools.combinations(sorted(handles.items()), 2):
        failed: list[int] = []
        status = calls.call(
            "nvlink", "nvmlDeviceGetP2PStatus", ha, hb, _P2P_NVLINK, on_code=failed.append
        )
        if status is None:
            return None
        if int(status) == _P2P_OK:
            pairs.append((a, b))
    return tuple(pairs)


def read_health(nvml: ModuleType) -> HealthSnapshot:
    """Every visible GPU's health.

    Raises:
        NVMLError: the GPU count itself could not be read (no driver, NVML not initialised).
    """
    calls = _Calls(nvml)
    gpus = []
    handles: dict[int, Any] = {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        health, handle = _read_gpu(calls, index)
        gpus.append(health)
        if handle is not None:
            handles[index] = handle
    nvlink = _nvlink(calls, handles)
    for gone in ("handle", "uuid"):  # a GPU without them is lost, or unknown as a whole
        calls.unknown.pop(gone, None)
    return HealthSnapshot(gpus=tuple(gpus), unknown=tuple(calls.unknown.items()), nvlink=nvlink)


# -- JSON on the worker's pipe -------------------------------------------------------------


def _enum_value(value: FabricState | RecoveryAction | None) -> int | None:
    return None if value is None else value.value


def health_to_json(snapshot: HealthSnapshot | None) -> dict[str, Any] | None:
    if snapshot is None:
        return None
    return {
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "lost": g.lost,
                "reset_required": g.reset_required,
                "volatile_dbe": g.volatile_dbe,
                "remap_pending": g.remap_pending,
                "remap_failed": g.remap_failed,
                "retired_pages_pending": g.retired_pages_pending,
                "persistence_on": g.persistence_on,
                "fabric": _enum_value(g.fabric),
                "recovery_action": _enum_value(g.recovery_action),
            }
            for g in snapshot.gpus
        ],
        "unknown": dict(snapshot.unknown),
        "nvlink": None if snapshot.nvlink is None else [list(p) for p in snapshot.nvlink],
    }


def _optional(kind: type[Any], value: Any) -> Any:
    return None if value is None else kind(value)


def health_from_json(data: Any) -> HealthSnapshot | None:
    """Raises KeyError/TypeError/ValueError on a document that is not a health read."""
    if data is None:
        return None
    gpus = tuple(
        GpuHealth(
            index=int(g["index"]),
            uuid=str(g["uuid"]),
            lost=bool(g["lost"]),
            reset_required=bool(g["reset_required"]),
            volatile_dbe=_optional(int, g["volatile_dbe"]),
            remap_pending=_optional(bool, g["remap_pending"]),
            remap_failed=_optional(bool, g["remap_failed"]),
            retired_pages_pending=_optional(bool, g["retired_pages_pending"]),
            persistence_on=_optional(bool, g["persistence_on"]),
            fabric=_optional(FabricState, g["fabric"]),
            recovery_action=_optional(RecoveryAction, g["recovery_action"]),
        )
        for g in data["gpus"]
    )
    nvlink = data["nvlink"]
    return HealthSnapshot(
        gpus=gpus,
        unknown=tuple((str(k), str(v)) for k, v in dict(data["unknown"]).items()),
        nvlink=None if nvlink is None else tuple((int(a), int(b)) for a, b in nvlink),
    )
