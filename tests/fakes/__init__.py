"""The test doubles of core.ports, in one place: a clock that advances instantly, an event queue
on that clock, a process table, a launched server and its launcher, probes, GPUs, a notifier, a
resetter and the reservation ledger. Every fake records what was done to it; none sleeps or
starts a process."""

from tests.fakes.clock import EPOCH_S, FakeClock, FakeEvents
from tests.fakes.gpus import RecordingResetter, ScriptedGpus, gpu
from tests.fakes.ledger import FakeLedger
from tests.fakes.processes import FakeProc, FakeProcesses
from tests.fakes.server import (
    FakeLauncher,
    FakeServer,
    ImmediateExecutor,
    RecordingNotifier,
    SwitchableProbe,
    rank,
)

__all__ = [
    "EPOCH_S",
    "FakeClock",
    "FakeEvents",
    "FakeLauncher",
    "FakeLedger",
    "FakeProc",
    "FakeProcesses",
    "FakeServer",
    "ImmediateExecutor",
    "RecordingNotifier",
    "RecordingResetter",
    "ScriptedGpus",
    "SwitchableProbe",
    "gpu",
    "rank",
]
