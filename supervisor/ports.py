"""Protocols the shell depends on; adapters implement them, tests pass fakes (style.md §5)."""

from __future__ import annotations

from typing import Protocol

from supervisor.core.gpu_release import ResetOutcome
from supervisor.core.readings import GpuState, ProcessInfo


class GpuSensor(Protocol):
    """Reads the GPUs. Implementations: real NVML, the simulation, or none."""

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        """All GPUs, or None when the GPU state is unknown (no driver, NVML hung)."""
        ...

    def close(self) -> None:
        """Release the library handle (a GPU reset needs every NVML client gone)."""
        ...


class Clock(Protocol):
    """Monotonic time and sleeping; tests pass a fake that advances instantly."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class GpuResetter(Protocol):
    """Resets one GPU (the configured gpu reset_command); tests pass a recording fake."""

    def reset(self, index: int, uuid: str) -> ResetOutcome:
        """Run the reset for GPU `index`/`uuid`; never raises, the outcome says what happened."""
        ...


class ServerHandle(Protocol):
    """What the memory watchdog needs of a running server tree (adapters.server_process)."""

    pid: int

    def tree(self) -> tuple[ProcessInfo, ...]:
        """Every process of the tree now (a full /proc scan)."""
        ...

    def kill_all(self, kind: str = ..., detail: str = ...) -> tuple[int, ...]:
        """SIGKILL the group and every descendant at once; the PIDs signalled."""
        ...

    def signal_group(self, sig: int) -> None: ...

    def tail(self) -> tuple[str, ...]:
        """The last lines of the server's output (already redacted)."""
        ...
