"""Protocols the shell depends on: adapters implement them, tests pass the fakes in tests/fakes.py.

Each is narrow (what one caller needs), so a fake stays small and a test says exactly which
outside thing it replaces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from supervisor.core.events import Event, KillReason
from supervisor.core.gpu_health import HealthSnapshot
from supervisor.core.gpu_release import ResetOutcome
from supervisor.core.ledger import Reservation
from supervisor.core.ownership import ProcessMarks
from supervisor.core.readings import ExitStatus, GpuState, ProcessInfo


class Clock(Protocol):
    """Monotonic time for deadlines, sleeping, and wall time for timestamps people read."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wall(self) -> float:
        """Seconds since the epoch; never used for deadlines."""
        ...


class GpuSensor(Protocol):
    """Reads the GPUs. Implementations: NVML in a worker process, the simulation, or none."""

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        """All GPUs, or None when the GPU state is unknown (no driver, NVML hung)."""
        ...

    def read_health(self) -> HealthSnapshot | None:
        """Every GPU's health and NVLink links (core/gpu_health.py), None when unknown."""
        ...

    def close(self) -> None:
        """Release the library handle (a GPU reset needs every NVML client gone)."""
        ...


class GpuResetter(Protocol):
    """Resets one GPU or NVLink peer set (the configured gpu reset_command); tests pass a
    recording fake. Called from several threads at once: the GPUs are reset in parallel."""

    def reset(self, index: int, uuid: str, indices: Sequence[int] = ()) -> ResetOutcome:
        """Run the reset for GPU `index`/`uuid` (`indices`: the whole peer set reset with it);
        never raises, the outcome says what happened."""
        ...

    def close(self) -> None:
        """End the resets running now and run no more (the supervisor is stopping): their
        `reset` calls return soon with a failed outcome."""
        ...


class ServerHandle(Protocol):
    """What the memory watchdog needs of a running server tree."""

    @property
    def pid(self) -> int: ...

    def tree(self) -> tuple[ProcessInfo, ...]:
        """Every process of the tree now (a full scan)."""
        ...

    def refresh(self, known: Sequence[ProcessInfo]) -> tuple[ProcessInfo, ...]:
        """The known processes re-read (state, memory); vanished ones left out."""
        ...

    def kill_all(self, reason: KillReason) -> tuple[int, ...]:
        """Record `reason` (the first recorded wins), SIGKILL the whole tree; the PIDs signalled."""
        ...

    def terminate(self, reason: KillReason) -> None:
        """Record `reason` and ask the server to drain and exit (SIGTERM to its main process
        only: SGLang's children have no handler and would die mid-request)."""
        ...

    def tail(self) -> tuple[str, ...]:
        """The last lines of the server's output (already redacted)."""
        ...

    def charged_bytes(self) -> int | None:
        """anon + shmem of the whole tree as the kernel charges its cgroup (one read); None
        when it has no cgroup with a memory controller: sum the members' Rss instead."""
        ...

    @property
    def memory_released(self) -> int:
        """Processes of the tree whose memory process_mrelease handed back after a kill."""
        ...


class LaunchedServer(ServerHandle, Protocol):
    """What the run loop needs of a launched server tree (adapters.server_process)."""

    @property
    def pgid(self) -> int: ...

    @property
    def run_id(self) -> str: ...

    @property
    def kill_reason(self) -> KillReason | None: ...

    @property
    def output_lines(self) -> int:
        """Lines the server has written so far (load progress)."""
        ...

    def poll(self) -> ExitStatus | None:
        """The main process's exit status once it has exited, else None."""
        ...

    def remaining(self) -> tuple[ProcessInfo, ...]:
        """Reap what is ours, then the processes of the tree still present."""
        ...

    def drain_output(self, timeout_s: float) -> None:
        """Wait until the server's output has been read to its end."""
        ...

    def oom_kill_count(self) -> int | None:
        """How many of the tree's processes the kernel OOM-killed so far (its cgroup's
        counter); None when it has no cgroup with a memory controller."""
        ...

    @property
    def mode(self) -> str:
        """How the tree is contained and read: a cgroup mode, or "/proc"."""
        ...

    def mark_ready(self) -> None:
        """The server is ready: its membership has settled."""
        ...

    def members_seen(self) -> Mapping[int, int]:
        """PID -> start ticks of every process of the tree seen alive so far."""
        ...

    def watch_exits(self, notify: Callable[[], None]) -> None:
        """From now on call `notify` (from any thread) when a process of the tree exits."""
        ...

    def close(self) -> None: ...


class ServerLauncher(Protocol):
    """Starts the server command in its own session with its output pumped to `sink`."""

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        run_id: str,
        sink: Callable[[str], None],
        redact: Callable[[str], str],
        oom_score_adj: int | None,
        tail_lines: int,
    ) -> LaunchedServer:
        """Raises OSError when the command cannot be executed."""
        ...


class Processes(Protocol):
    """The host's processes as the run loop sees them: marks to judge ownership, and kill."""

    def marks(self, pid: int) -> ProcessMarks | None:
        """The process's marks, None when it is gone."""
        ...

    def scan(self) -> tuple[ProcessMarks, ...]:
        """Every process on the host (a full /proc scan: used once, before the first launch)."""
        ...

    def kill(self, pid: int) -> bool:
        """SIGKILL one process (and hand its memory back); False when it was already gone.

        Raises:
            PermissionError: another user's process.
        """
        ...

    def reap(self, pids: Sequence[int]) -> None:
        """Collect the exit status of those that are our children (no zombies left behind)."""
        ...

    def reap_orphans(self) -> list[int]:
        """As a container's PID 1, reap every orphaned zombie no one else waits for."""
        ...

    def oom_kill_count(self) -> int | None:
        """The kernel's OOM-kill counter, None when unknown."""
        ...

    def self_mark(self) -> str:
        """This supervisor as the server's environment names it: "<pid>:<start ticks>"."""
        ...

    @property
    def self_pid(self) -> int: ...


class EventQueue(Protocol):
    """The runner's one queue: signals and watchdog events; safe to `put` from any thread."""

    def put(self, event: Event) -> None: ...

    def get(self, timeout_s: float) -> Event | None:
        """The next event, waiting up to `timeout_s`; None when none came."""
        ...


class Notifier(Protocol):
    """systemd's sd_notify, or a recorder in tests."""

    @property
    def watchdog_interval_s(self) -> float | None: ...

    def ready(self, status: str | None = None) -> bool: ...

    def status(self, text: str) -> bool: ...

    def watchdog(self) -> bool: ...

    def extend_timeout(self, seconds: float) -> bool: ...

    def stopping(self, status: str | None = None) -> bool: ...


class ReservationBook(Protocol):
    """The host-wide reservation ledger while its lock is held (adapters.ledger)."""

    def others(self) -> tuple[Reservation, ...]:
        """Live entries of other supervisors with bytes still to pin."""
        ...

    def set(self, planned_bytes: int, pinned_bytes: int = 0) -> None: ...


class Reservations(Protocol):
    """This supervisor's entry in the host-wide reservation ledger (core/ledger.py)."""

    def session(self) -> AbstractContextManager[ReservationBook]:
        """The ledger under its lock: a pre-flight and the reservation it leads to in one."""
        ...

    def set(self, planned_bytes: int, pinned_bytes: int = 0) -> None: ...

    def drop(self) -> None: ...
