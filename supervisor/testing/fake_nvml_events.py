# ruff: noqa: N802, N803, N815 - pynvml's function and parameter names are the contract
"""The simulated NVML's event API over the state dir's event queue (gpu_events.py).

As NVML: an event set receives the events of the types it registered, on the GPUs it registered,
that happened after the registration, each once, in the order they happened.
nvmlEventSetWait_v2 returns the next one, or waits up to `timeoutms` for one (polling the queue,
never spinning) and raises NVMLError_Timeout (NVML_ERROR_TIMEOUT). A lost GPU's events still
arrive; the wait itself never raises GPU_IS_LOST here (real NVML may). Re-exported by
supervisor.testing.fake_nvml.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pynvml
from pynvml import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVMLError,
)

from supervisor.testing import fake_nvml_core as core
from supervisor.testing import gpu_events, gpu_faults
from supervisor.testing.fake_nvml_core import Handle

# How often a waiting event set looks at the queue: bounds the delivery delay, not the CPU.
_POLL_S = 0.02
_INSTANCE_ID_NONE = 0xFFFFFFFF  # not a MIG event


@dataclass(frozen=True, slots=True)
class SimEventData:
    """Shaped like pynvml.c_nvmlEventData_t (same attribute names); `device` is a handle."""

    device: Handle
    eventType: int  # one nvmlEventType* bit
    eventData: int  # the Xid for nvmlEventTypeXidCriticalError, the action for
    # nvmlEventTypeGpuRecoveryAction, 0 otherwise
    gpuInstanceId: int = _INSTANCE_ID_NONE
    computeInstanceId: int = _INSTANCE_ID_NONE


@dataclass(eq=False)
class _EventSet:
    """Opaque, as pynvml's c_nvmlEventSet_t: callers only pass it back."""

    state_dir: Path
    cursor: int | None = None  # where the next unread event starts in the queue
    # GPU index -> (handle, [(event types, queue offset at registration), ...])
    registered: dict[int, tuple[Handle, list[tuple[int, int]]]] = field(default_factory=dict)
    freed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _event_set(eventSet: object) -> _EventSet:
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return eventSet


def _supported(health: gpu_faults.SimHealth) -> int:
    missing = 0
    for name in health.unsupported:
        if name.startswith("nvmlEventType"):
            missing |= int(getattr(pynvml, name))
    return int(gpu_events.SUPPORTED_EVENT_TYPES) & ~missing


def nvmlEventSetCreate() -> _EventSet:
    return _EventSet(core.state_dir())


def nvmlDeviceGetSupportedEventTypes(handle: Handle) -> int:
    """The nvmlEventType* bits this GPU delivers (Xid, single- and double-bit ECC, recovery
    action; less those its simulated driver lacks)."""
    _, health = core.device(handle, "nvmlDeviceGetSupportedEventTypes")
    return _supported(health)


def nvmlDeviceRegisterEvents(handle: Handle, eventTypes: int, eventSet: _EventSet) -> None:
    """Deliver this GPU's later events of `eventTypes` to the set; NVMLError_NotSupported when a
    requested type is not supported (nothing is registered then)."""
    events = _event_set(eventSet)
    gpu, health = core.device(handle, "nvmlDeviceRegisterEvents")
    if eventTypes & ~_supported(health):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    now = gpu_events.events_end(events.state_dir)
    with events.lock:
        if events.cursor is None:
            events.cursor = now
        _, registrations = events.registered.setdefault(gpu.index, (handle, []))
        registrations.append((eventTypes, now))


def _next(events: _EventSet) -> SimEventData | None:
    """The next event for this set, consuming what it skips; None when none is queued."""
    with events.lock:
        if events.cursor is None:
            return None
        if gpu_events.events_end(events.state_dir) < events.cursor:
            events.cursor = 0  # the state dir was recreated: its queue starts over
        start = events.cursor
        for event in gpu_events.read_events(events.state_dir, start):
            events.cursor = event.end_offset
            handle, registrations = events.registered.get(event.gpu_index, (None, []))
            wanted = any(
                event.event_type & types and start >= since for types, since in registrations
            )
            start = event.end_offset
            if wanted and handle is not None:
                return SimEventData(handle, event.event_type, event.data)
        return None


def nvmlEventSetWait_v2(eventSet: _EventSet, timeoutms: int) -> SimEventData:
    """The next event (.device, .eventType, .eventData, as c_nvmlEventData_t), or
    NVMLError_Timeout after `timeoutms` milliseconds without one."""
    events = _event_set(eventSet)
    core.state_dir()
    deadline = time.monotonic() + timeoutms / 1000
    while True:
        found = _next(events)
        if found is not None:
            return found
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(min(left_s, _POLL_S))


def nvmlEventSetWait(eventSet: _EventSet, timeoutms: int) -> SimEventData:
    """pynvml's older name for nvmlEventSetWait_v2."""
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet: _EventSet) -> None:
    events = _event_set(eventSet)
    core.state_dir()
    events.freed = True
