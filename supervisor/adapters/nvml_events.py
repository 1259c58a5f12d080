"""NVML driver events, inside the GPU worker process (adapters/gpu_guard.py): one event set made
when the worker starts, drained at each "events" request; and their JSON on the worker's pipe.

Registered per GPU for what it supports (nvmlDeviceGetSupportedEventTypes): critical Xids,
double- and single-bit ECC errors, and recovery-action changes. A GPU or driver without the
event API is reported as `unwatched` (the supervisor logs it once) and only polled. Each event
gets the wall time it was received and the GPU's recovery action read at that moment. The wait
runs inside a request, so a wait that hangs in the driver misses the request's deadline like
any other query.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import time
from collections.abc import Callable, Hashable
from types import ModuleType
from typing import Any

import structlog

from supervisor.core.gpu_health import EventKind, GpuEvent, RecoveryAction

log = structlog.get_logger("supervisor.gpu_guard")

# pynvml's names for the event types the supervisor registers (older pynvml lacks the last).
_WANTED = {
    "nvmlEventTypeXidCriticalError": EventKind.XID,
    "nvmlEventTypeDoubleBitEccError": EventKind.DOUBLE_BIT_ECC,
    "nvmlEventTypeSingleBitEccError": EventKind.SINGLE_BIT_ECC,
    "nvmlEventTypeGpuRecoveryAction": EventKind.RECOVERY_ACTION,
}
# One request hands back at most this many; the rest stay queued in the set for the next.
MAX_EVENTS_PER_REQUEST = 64
# nvml.h's codes (stable ABI): a pynvml-shaped module need not export them.
_SUCCESS = 0  # NVML_SUCCESS
_TIMEOUT = 10  # NVML_ERROR_TIMEOUT
_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
# nvml.h NVML_VALUE_TYPE_* -> c_nvmlValue_t's member.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _handle_key(handle: Any) -> Hashable:
    """Equal for the same device: pynvml's handles are ctypes pointers (compared by address);
    a pynvml-shaped module's may be any hashable value."""
    if isinstance(handle, ctypes._Pointer):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    return handle if isinstance(handle, Hashable) else id(handle)


class EventWatch:
    """The worker's event set over every GPU, and what could not be watched."""

    def __init__(self, nvml: ModuleType, wall: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._wall = wall
        self._gpus: dict[Hashable, tuple[int, str, Any]] = {}  # handle key -> index, uuid, handle
        self._lost: set[int] = set()
        self.unwatched: list[dict[str, Any]] = []  # {"gpu", "reason"}; gpu None: every GPU
        self._set: Any = None
        try:
            self._set = nvml.nvmlEventSetCreate()
            count = int(nvml.nvmlDeviceGetCount())
        except (AttributeError, nvml.NVMLError) as exc:
            self.unwatched.append({"gpu": None, "reason": _why(exc)})
            return
        for index in range(count):
            self._register(index)

    def _register(self, index: int) -> None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(nvml.nvmlDeviceGetUUID(handle))
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            wanted = {kind: getattr(nvml, name, 0) for name, kind in _WANTED.items()}
            mask = sum(bit for bit in wanted.values() if bit & supported)
            missing = sorted(kind.value for kind, bit in wanted.items() if not bit & supported)
            if mask:
                nvml.nvmlDeviceRegisterEvents(handle, mask, self._set)
        except (AttributeError, nvml.NVMLError) as exc:
            self.unwatched.append({"gpu": index, "reason": _why(exc)})
            return
        self._gpus[_handle_key(handle)] = (index, uuid, handle)
        if missing:
            self.unwatched.append({"gpu": index, "reason": f"not supported: {', '.join(missing)}"})

    def drain(self, wait_ms: int) -> list[GpuEvent]:
        """Events arrived since the last drain; waits up to `wait_ms` for the first."""
        nvml = self._nvml
        events: list[GpuEvent] = []
        if self._set is None:
            return events
        timeout_ms = max(0, wait_ms)
        while len(events) < MAX_EVENTS_PER_REQUEST:
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, timeout_ms)
            except nvml.NVMLError as exc:
                if exc.value == _GPU_IS_LOST:
                    events += self._lost_gpus()
                elif exc.value != _TIMEOUT:  # TIMEOUT: nothing (more) happened
                    note = {"gpu": None, "reason": f"the event wait failed: {_why(exc)}"}
                    if note not in self.unwatched:
                        self.unwatched.append(note)
                return events
            timeout_ms = 0  # the rest of what is queued, without waiting
            event = self._event(data)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(AttributeError, self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._set)
            self._set = None

    def _event(self, data: Any) -> GpuEvent | None:
        nvml = self._nvml
        kind = next(
            (k for name, k in _WANTED.items() if getattr(nvml, name, 0) == data.eventType), None
        )
        found = self._gpus.get(_handle_key(data.device)) or self._by_uuid(data.device)
        if kind is None or found is None:
            return None  # not a type registered here, or a device this set does not know
        index, uuid, handle = found
        code = int(data.eventData) if kind in (EventKind.XID, EventKind.RECOVERY_ACTION) else 0
        return GpuEvent(
            index=index,
            uuid=uuid,
            kind=kind,
            code=code,
            at_s=self._wall(),
            recovery_action=self.recovery_action(handle),
        )

    def _by_uuid(self, handle: Any) -> tuple[int, str, Any] | None:
        try:
            uuid = str(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError:
            return None
        return next((gpu for gpu in self._gpus.values() if gpu[1] == uuid), None)

    def _lost_gpus(self) -> list[GpuEvent]:
        """The wait says a GPU is lost: which ones (their own calls say so too), once each."""
        nvml = self._nvml
        lost = []
        for index, uuid, handle in self._gpus.values():
            if index in self._lost:
                continue
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle)  # a call the driver must answer itself
            except nvml.NVMLError as exc:
                if exc.value != _GPU_IS_LOST:
                    continue
                self._lost.add(index)
                lost.append(
                    GpuEvent(
                        index=index, uuid=uuid, kind=EventKind.GPU_LOST, code=0, at_s=self._wall()
                    )
                )
        return lost

    def recovery_action(self, handle: Any) -> RecoveryAction | None:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION now; None when the driver cannot say."""
        nvml = self._nvml
        field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            return None
        try:
            value = nvml.nvmlDeviceGetFieldValues(handle, [field])[0]
            if value.nvmlReturn != _SUCCESS:
                return None
            member = _VALUE_MEMBERS[value.valueType]
            return RecoveryAction(int(getattr(value.value, member)))
        except (AttributeError, IndexError, TypeError, ValueError, nvml.NVMLError):
            return None


def _why(exc: Exception) -> str:
    if isinstance(exc, AttributeError):
        return "the NVML library has no event API"
    return f"NVML: {exc}"


def event_to_json(event: GpuEvent) -> dict[str, Any]:
    action = event.recovery_action
    return {
        "index": event.index,
        "uuid": event.uuid,
        "kind": event.kind.value,
        "code": event.code,
        "at_s": event.at_s,
        "recovery_action": None if action is None else action.value,
    }


def event_from_json(data: Any) -> GpuEvent:
    """Raises ValueError/KeyError/TypeError on what is not an event."""
    action = data["recovery_action"]
    return GpuEvent(
        index=int(data["index"]),
        uuid=str(data["uuid"]),
        kind=EventKind(data["kind"]),
        code=int(data["code"]),
        at_s=float(data["at_s"]),
        recovery_action=None if action is None else RecoveryAction(int(action)),
    )


def answer(watch: EventWatch | None, wait_ms: int) -> dict[str, Any]:
    """The worker's answer to "events": what arrived, and (each time) what is not watched."""
    if watch is None:
        return {"events": None, "unwatched": []}  # NVML did not start: the GPU state is unknown
    events = watch.drain(wait_ms)
    return {"events": [event_to_json(e) for e in events], "unwatched": watch.unwatched}


def events_from_answer(
    line: str, logged: set[tuple[int | None, str]]
) -> tuple[GpuEvent, ...] | None:
    """The supervisor's side of "events": the events, or None when NVML cannot say; what is
    not watched is logged once (`logged` holds what was)."""
    try:
        data = json.loads(line)
        for item in data.get("unwatched") or ():
            key = (item.get("gpu"), str(item.get("reason")))
            if key not in logged:
                logged.add(key)
                log.warning("gpu_events_unwatched", gpu=key[0], reason=key[1])
        if data.get("events") is None:
            return None
        return tuple(event_from_json(e) for e in data["events"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
