# ruff: noqa: N802, N815 - pynvml's function and constant names are the contract
"""adapters.nvml_events: the NVML event set of the GPU worker, against the simulated NVML (the
same calls as pynvml) and a stub with pynvml's own ctypes handles; and through the worker."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from supervisor.adapters.gpu_guard import GuardedGpuSensor
from supervisor.adapters.nvml_events import (
    EventWatch,
    answer,
    event_from_json,
    event_to_json,
    events_from_answer,
)
from supervisor.core.gpu_health import EventKind, GpuEvent, RecoveryAction
from supervisor.testing import fake_nvml, gpu_faults, gpu_state

SIM = "supervisor.testing.fake_nvml"


@pytest.fixture
def gpus(make_gpu_state: Callable[..., Path]) -> Iterator[Path]:
    state = make_gpu_state(2)
    fake_nvml.set_state_dir(state)
    fake_nvml.nvmlInit()
    yield state
    fake_nvml.nvmlShutdown()
    fake_nvml.set_state_dir(None)


def test_events_arrive_once_with_their_gpu_kind_code_and_the_drivers_action(gpus: Path):
    watch = EventWatch(fake_nvml, wall=lambda: 1234.5)
    assert watch.unwatched == []
    assert watch.drain(0) == []
    gpu_faults.inject(gpus, 1, "xid", "48")  # a DBE: the driver asks for a GPU reset
    gpu_faults.inject(gpus, 0, "xid", "13")
    gpu_faults.inject(gpus, 0, "sbe")
    events = watch.drain(0)
    assert events == [
        GpuEvent(
            index=1,
            uuid=gpu_state.gpu_uuid(1),
            kind=EventKind.XID,
            code=48,
            at_s=1234.5,
            recovery_action=RecoveryAction.GPU_RESET,
        ),
        GpuEvent(
            index=0,
            uuid=gpu_state.gpu_uuid(0),
            kind=EventKind.XID,
            code=13,
            at_s=1234.5,
            recovery_action=RecoveryAction.NONE,
        ),
        GpuEvent(
            index=0,
            uuid=gpu_state.gpu_uuid(0),
            kind=EventKind.SINGLE_BIT_ECC,
            code=0,
            at_s=1234.5,
            recovery_action=RecoveryAction.NONE,
        ),
    ]
    assert watch.drain(0) == []  # each once
    watch.close()


def test_a_recovery_action_event_and_a_lost_gpus_xid(gpus: Path):
    watch = EventWatch(fake_nvml)
    gpu_faults.inject(gpus, 0, "recovery-action", "drain-p2p")
    gpu_faults.inject(gpus, 1, "xid", "79")  # the GPU is lost: its action cannot be read
    first, second = watch.drain(0)
    assert (first.kind, first.code) == (EventKind.RECOVERY_ACTION, RecoveryAction.DRAIN_P2P.value)
    assert (second.index, second.kind, second.code) == (1, EventKind.XID, 79)
    assert second.recovery_action is None
    watch.close()


def test_events_before_the_set_was_made_are_not_delivered(gpus: Path):
    gpu_faults.inject(gpus, 0, "xid", "79")
    gpu_faults.inject(gpus, 1, "dbe")
    watch = EventWatch(fake_nvml)
    assert watch.drain(0) == []
    watch.close()


def test_a_gpu_without_an_event_type_or_without_events_is_reported_unwatched(gpus: Path):
    gpu_faults.inject(gpus, 0, "unsupported", "nvmlEventTypeGpuRecoveryAction")
    gpu_faults.inject(gpus, 1, "unsupported", "nvmlDeviceGetSupportedEventTypes")
    watch = EventWatch(fake_nvml)
    assert watch.unwatched == [
        {"gpu": 0, "reason": "not supported: recovery_action"},
        {"gpu": 1, "reason": "NVML: Not Supported"},
    ]
    gpu_faults.inject(gpus, 0, "xid", "31")
    gpu_faults.inject(gpus, 1, "xid", "31")
    assert [(e.index, e.code) for e in watch.drain(0)] == [(0, 31)]  # GPU 1 only polled
    watch.close()


class _Stub:
    """pynvml-shaped, with pynvml's ctypes device handles and error classes: a driver whose
    wait reports a lost GPU, or one without the event API at all."""

    NVMLError = pynvml.NVMLError
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = pynvml.nvmlEventTypeDoubleBitEccError
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

    def __init__(
        self, queued: list[tuple[int, int, int]], lost: set[int], wait_error: int | None = None
    ) -> None:
        self._devices = [pynvml.struct_c_nvmlDevice_t() for _ in range(2)]
        self.queued = queued  # (gpu, event type, data)
        self.lost = lost
        self.wait_error = wait_error

    def _handle(self, index: int) -> Any:
        return ctypes.pointer(self._devices[index])  # a new pointer object each call, as pynvml

    def _index(self, handle: Any) -> int:
        address = ctypes.addressof(handle.contents)
        return next(i for i, d in enumerate(self._devices) if ctypes.addressof(d) == address)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._handle(index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-{self._index(handle)}"

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: object) -> None:
        pass

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> None:
        if self._index(handle) in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetFieldValues(self, handle: Any, ids: list[int]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * 1)()
        values[0].fieldId = ids[0]
        values[0].nvmlReturn = pynvml.NVML_SUCCESS
        values[0].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        values[0].value.uiVal = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
        return values

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if self.wait_error is not None:
            raise pynvml.NVMLError(self.wait_error)
        if not self.queued:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, kind, data = self.queued.pop(0)
        return SimpleNamespace(device=self._handle(gpu), eventType=kind, eventData=data)

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass


def test_pynvml_handles_are_matched_by_address_and_the_action_read_from_the_field():
    stub = _Stub([(1, pynvml.nvmlEventTypeXidCriticalError, 94)], lost=set())
    watch = EventWatch(stub)  # type: ignore[arg-type]
    # the older pynvml's missing constant: no recovery-action events on any GPU
    assert watch.unwatched == [
        {"gpu": 0, "reason": "not supported: recovery_action, sbe"},
        {"gpu": 1, "reason": "not supported: recovery_action, sbe"},
    ]
    (event,) = watch.drain(100)
    assert (event.index, event.uuid, event.code) == (1, "GPU-1", 94)
    assert event.recovery_action is RecoveryAction.GPU_RESET


def test_a_wait_that_reports_a_lost_gpu_names_it_once():
    stub = _Stub([], lost={1})
    watch = EventWatch(stub)  # type: ignore[arg-type]
    (lost,) = watch.drain(0)
    assert (lost.index, lost.kind) == (1, EventKind.GPU_LOST)
    assert watch.drain(0) == []


def test_a_wait_that_fails_otherwise_is_reported_unwatched_once():
    watch = EventWatch(_Stub([], lost=set(), wait_error=pynvml.NVML_ERROR_UNKNOWN))  # type: ignore[arg-type]
    assert watch.drain(0) == []
    assert watch.drain(0) == []
    assert watch.unwatched[-1] == {
        "gpu": None,
        "reason": "the event wait failed: NVML: Unknown Error",
    }
    assert len(watch.unwatched) == 3  # both GPUs' missing types, and this once


def test_a_library_without_the_event_api_is_unwatched_and_polled():
    watch = EventWatch(SimpleNamespace(NVMLError=pynvml.NVMLError))  # type: ignore[arg-type]
    assert watch.unwatched == [{"gpu": None, "reason": "the NVML library has no event API"}]
    assert watch.drain(100) == []


def test_events_survive_the_json_round_trip_and_a_bad_answer_is_unknown():
    event = GpuEvent(
        index=3,
        uuid="GPU-3",
        kind=EventKind.RECOVERY_ACTION,
        code=2,
        at_s=5.25,
        recovery_action=RecoveryAction.NODE_REBOOT,
    )
    assert event_from_json(event_to_json(event)) == event
    assert answer(None, 0) == {"events": None, "unwatched": []}
    assert events_from_answer("not json", set()) is None
    assert events_from_answer('{"events": [{"index": 1}]}', set()) is None


def test_what_is_not_watched_is_logged_once():
    seen: set[tuple[int | None, str]] = set()
    line = '{"events": [], "unwatched": [{"gpu": 0, "reason": "not supported: sbe"}]}'
    with capture_logs() as logs:
        assert events_from_answer(line, seen) == ()
        assert events_from_answer(line, seen) == ()
    assert [(e["event"], e["gpu"], e["reason"]) for e in logs] == [
        ("gpu_events_unwatched", 0, "not supported: sbe")
    ]


def test_the_worker_delivers_events_and_a_hung_wait_misses_its_deadline(
    make_gpu_state: Callable[..., Path],
):
    state = make_gpu_state(2)
    guard = GuardedGpuSensor(SIM, env={"FAKE_GPU_STATE_DIR": str(state)}, timeout_s=1.0)
    try:
        assert guard.read_events(0) == ()  # the worker's event set is made at its start
        gpu_faults.inject(state, 1, "xid", "79")
        events = guard.read_events(50)
        assert events is not None
        assert [(e.index, e.kind, e.code) for e in events] == [(1, EventKind.XID, 79)]
        gpu_state.set_nvml_hang(state, 3600.0)
        assert guard.read_events(0) is None  # NVML hung: unknown, within the deadline
        assert guard.hangs == 1
    finally:
        gpu_state.set_nvml_hang(state, None)
        guard.close()
