"""GPUs scripted on the fake clock, and a recording reset command."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from supervisor.core.gpu_health import HealthSnapshot
from supervisor.core.gpu_release import ResetOutcome
from supervisor.core.readings import GpuProcess, GpuState
from tests.fakes.clock import FakeClock

GB = 10**9


def gpu(index: int, used: int, *pids: int, total: int = 80 * GB) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        name="sim",
        total_bytes=total,
        used_bytes=used,
        processes=tuple(GpuProcess(pid=p, used_bytes=used) for p in pids),
    )


class ScriptedGpus:
    """core.ports.GpuSensor whose snapshot (and health) a function of the fake clock computes."""

    def __init__(
        self,
        clock: FakeClock,
        snapshot: Callable[[float], tuple[GpuState, ...] | None],
        health: Callable[[float], HealthSnapshot | None] = lambda _now: None,
    ) -> None:
        self.clock = clock
        self.snapshot = snapshot
        self.health = health
        self.reads = 0
        self.health_reads = 0
        self.closed = 0

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        self.reads += 1
        return self.snapshot(self.clock.now)

    def read_health(self) -> HealthSnapshot | None:
        self.health_reads += 1
        return self.health(self.clock.now)

    def close(self) -> None:
        self.closed += 1


class RecordingResetter:
    """core.ports.GpuResetter that records resets and runs `on_reset` (the GPU gets clean)."""

    def __init__(self, ok: bool = True, on_reset: Callable[[int], None] | None = None) -> None:
        self.ok = ok
        self.calls: list[tuple[int, str]] = []
        self.sets: list[tuple[int, ...]] = []  # the `{indices}` of each call
        self.on_reset = on_reset
        self.closed = False

    def reset(self, index: int, uuid: str, indices: Sequence[int] = ()) -> ResetOutcome:
        self.calls.append((index, uuid))
        self.sets.append(tuple(indices))
        if self.on_reset is not None:
            self.on_reset(index)
        return ResetOutcome(ok=self.ok, detail="" if self.ok else "in use")

    def close(self) -> None:
        self.closed = True
