"""The Xid watch against real NVML, read-only (no injection): the event set registers on every
GPU or says why not, a wait with nothing pending answers in time, the recovery action reads as
an action or unknown, and the guarded worker answers "events". Needs an NVIDIA GPU and driver:
`pytest -m gpu tests/gpu`; skipped where NVML does not start."""

from __future__ import annotations

from types import ModuleType

import pytest

from supervisor.adapters.gpu_guard import GuardedGpuSensor
from supervisor.adapters.nvml_events import EventWatch
from supervisor.core.gpu_health import RecoveryAction

pytestmark = pytest.mark.gpu


def test_the_event_set_registers_and_an_empty_wait_answers(nvml: ModuleType):
    count = nvml.nvmlDeviceGetCount()
    watch = EventWatch(nvml)
    try:
        for item in watch.unwatched:  # a GPU without ECC has no ECC events, say
            assert item["gpu"] is None or 0 <= item["gpu"] < count
            assert item["reason"]
        events = watch.drain(100)  # usually nothing; an event that did happen is a real one
        assert all(0 <= e.index < count and e.uuid.startswith("GPU-") for e in events)
    finally:
        watch.close()


def test_the_recovery_action_is_an_action_or_unknown(nvml: ModuleType):
    watch = EventWatch(nvml)
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            action = watch.recovery_action(nvml.nvmlDeviceGetHandleByIndex(index))
            assert action is None or isinstance(action, RecoveryAction)
    finally:
        watch.close()


def test_the_worker_answers_events_from_the_driver(nvml: ModuleType):
    guard = GuardedGpuSensor("pynvml", timeout_s=10.0)
    try:
        assert guard.read_gpus() is not None
        events = guard.read_events(100)
        assert events is not None
        assert guard.hangs == 0
    finally:
        guard.close()
