"""The test doubles of core.ports, in one place: a clock that advances instantly, an event queue
on that clock, a process table, a launched server, probes, GPUs, a notifier and a resetter.

Every fake records what was done to it so a test can assert on it; none sleeps or starts a
process.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from supervisor.core.events import Event, KillReason
from supervisor.core.gpu_release import ResetOutcome
from supervisor.core.lifecycle import HealthStatus
from supervisor.core.ownership import ProcessMarks
from supervisor.core.readings import ExitStatus, GpuProcess, GpuState, ProcessInfo

GB = 10**9
EPOCH_S = 1_800_000_000.0  # wall time of FakeClock's zero


class FakeClock:
    """Monotonic time that only moves when someone sleeps (or a test advances it)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)

    def wall(self) -> float:
        return EPOCH_S + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeEvents:
    """An event queue on a FakeClock: `get` jumps the clock to the next scheduled event within
    the timeout (or to the timeout), and runs the clock's alarms on the way."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._queue: list[tuple[float, int, Event]] = []
        self._alarms: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def put(self, event: Event) -> None:
        self.at(self.clock.now, event)

    def at(self, when_s: float, event: Event) -> None:
        """Deliver `event` once the clock reaches `when_s`."""
        self._seq += 1
        self._queue.append((when_s, self._seq, event))
        self._queue.sort(key=lambda e: (e[0], e[1]))

    def call_at(self, when_s: float, action: Callable[[], None]) -> None:
        """Run `action` once the clock reaches `when_s` (a rank dies, a probe changes ...)."""
        self._seq += 1
        self._alarms.append((when_s, self._seq, action))
        self._alarms.sort(key=lambda a: (a[0], a[1]))

    def get(self, timeout_s: float) -> Event | None:
        deadline = self.clock.now + max(0.0, timeout_s)
        while True:
            next_alarm = self._alarms[0][0] if self._alarms else float("inf")
            next_event = self._queue[0][0] if self._queue else float("inf")
            if next_alarm <= min(next_event, deadline):
                when, _seq, action = self._alarms.pop(0)
                self.clock.now = max(self.clock.now, when)
                action()
                continue
            if next_event <= deadline:
                when, _seq, event = self._queue.pop(0)
                self.clock.now = max(self.clock.now, when)
                return event
            self.clock.now = deadline
            return None


@dataclasses.dataclass
class FakeProc:
    """One process in a FakeProcesses table."""

    pid: int
    title: str = "python"
    state: str = "S"
    start_ticks: int = 1000
    instance: str | None = None
    launched_by: str | None = None
    launcher_alive: bool = False
    survives_kill: bool = False  # a D-state process: SIGKILL stays pending

    def marks(self) -> ProcessMarks:
        return ProcessMarks(
            pid=self.pid,
            start_ticks=self.start_ticks,
            state=self.state,
            title=self.title,
            instance=self.instance,
            launched_by=self.launched_by,
            launcher_alive=self.launcher_alive,
        )


class FakeProcesses:
    """core.ports.Processes over a dict: kill removes a process unless it survives kills."""

    def __init__(self, procs: Iterable[FakeProc] = (), *, self_pid: int = 1) -> None:
        self.procs = {p.pid: p for p in procs}
        self._self_pid = self_pid
        self.killed: list[int] = []
        self.oom_kills: int | None = 0

    @property
    def self_pid(self) -> int:
        return self._self_pid

    def add(self, proc: FakeProc) -> FakeProc:
        self.procs[proc.pid] = proc
        return proc

    def marks(self, pid: int) -> ProcessMarks | None:
        proc = self.procs.get(pid)
        return proc.marks() if proc is not None else None

    def scan(self) -> tuple[ProcessMarks, ...]:
        return tuple(p.marks() for p in self.procs.values())

    def kill(self, pid: int) -> bool:
        self.killed.append(pid)
        proc = self.procs.get(pid)
        if proc is None:
            return False
        if not proc.survives_kill:
            del self.procs[pid]
        return True

    def reap(self, pids: Sequence[int]) -> None:
        pass

    def oom_kill_count(self) -> int | None:
        return self.oom_kills

    def self_mark(self) -> str:
        return f"{self._self_pid}:1"


def rank(pid: int, title: str, *, state: str = "S", shmem: int = 0, ppid: int = 100) -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        ppid=ppid,
        pgid=ppid,
        state=state,
        title=title,
        rss_shmem_bytes=shmem,
        start_ticks=5000 + pid,
    )


class FakeServer:
    """core.ports.LaunchedServer: a main process and ranks the test kills, stops or ends."""

    def __init__(self, pid: int, run_id: str, ranks: int, lines: Sequence[str] = ()) -> None:
        self._pid = pid
        self._run_id = run_id
        self.ranks = {
            pid + 1 + i: rank(pid + 1 + i, f"sglang::scheduler_TP{i}", ppid=pid)
            for i in range(ranks)
        }
        self.main_alive = True
        self.exit: ExitStatus | None = None
        self.lines = list(lines)
        self.reasons: list[KillReason] = []
        self.terminated = 0
        self.closed = False
        self.exit_on_term: ExitStatus | None = ExitStatus(exit_code=0, signal_number=None)

    # -- what the test does ----------------------------------------------------------------

    def crash_rank(self, index: int = 0) -> None:
        """A rank dies: it leaves the tree (SGLang's main process lives on for a while)."""
        del self.ranks[self._pid + 1 + index]

    def set_rank_state(self, index: int, state: str) -> None:
        pid = self._pid + 1 + index
        self.ranks[pid] = dataclasses.replace(self.ranks[pid], state=state)

    def exit_by_itself(self, code: int | None, signal_number: int | None = None) -> None:
        self.main_alive = False
        self.ranks.clear()
        self.exit = ExitStatus(exit_code=code, signal_number=signal_number)

    # -- the port -------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def pgid(self) -> int:
        return self._pid

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def kill_reason(self) -> KillReason | None:
        return self.reasons[0] if self.reasons else None

    @property
    def output_lines(self) -> int:
        return len(self.lines)

    def tree(self) -> tuple[ProcessInfo, ...]:
        main = (
            (rank(self._pid, "python -m sglang.launch_server", ppid=1),) if self.main_alive else ()
        )
        return main + tuple(self.ranks.values())

    def refresh(self, known: Sequence[ProcessInfo]) -> tuple[ProcessInfo, ...]:
        live = {p.pid: p for p in self.tree()}
        return tuple(live[p.pid] for p in known if p.pid in live)

    def kill_all(self, reason: KillReason) -> tuple[int, ...]:
        self.reasons.append(reason)
        pids = tuple(p.pid for p in self.tree())
        if self.main_alive:
            self.main_alive = False
            self.exit = ExitStatus(exit_code=None, signal_number=9)
        self.ranks.clear()
        return pids

    def terminate(self, reason: KillReason) -> None:
        self.reasons.append(reason)
        self.terminated += 1
        if self.exit_on_term is not None and self.main_alive:
            self.main_alive = False
            self.ranks.clear()
            self.exit = self.exit_on_term

    def tail(self) -> tuple[str, ...]:
        return tuple(self.lines[-200:])

    def poll(self) -> ExitStatus | None:
        return None if self.main_alive else self.exit

    def remaining(self) -> tuple[ProcessInfo, ...]:
        return self.tree()

    def drain_output(self, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeLauncher:
    """core.ports.ServerLauncher: hands out FakeServers with 8 ranks (or `ranks`)."""

    def __init__(self, ranks: int = 2, first_pid: int = 1000) -> None:
        self.ranks = ranks
        self.next_pid = first_pid
        self.started: list[FakeServer] = []
        self.argvs: list[tuple[str, ...]] = []
        self.envs: list[Mapping[str, str]] = []
        self.on_start: Callable[[FakeServer], None] | None = None

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
    ) -> FakeServer:
        server = FakeServer(self.next_pid, run_id, self.ranks)
        self.next_pid += 100
        self.started.append(server)
        self.argvs.append(tuple(argv))
        self.envs.append(dict(env))
        if self.on_start is not None:
            self.on_start(server)
        return server

    @property
    def last(self) -> FakeServer:
        return self.started[-1]


class SwitchableProbe:
    """A health probe whose answer the test sets (REFUSED while loading, then READY ...)."""

    def __init__(self, answer: HealthStatus = HealthStatus.REFUSED) -> None:
        self.answer = answer
        self.calls = 0

    def __call__(self) -> HealthStatus:
        self.calls += 1
        return self.answer


class ImmediateExecutor(concurrent.futures.Executor):
    """Runs the submitted probe at once, so a tick sees its answer deterministically."""

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        return future


class RecordingNotifier:
    """core.ports.Notifier that keeps every message."""

    def __init__(self, watchdog_interval_s: float | None = None) -> None:
        self.messages: list[str] = []
        self._interval = watchdog_interval_s

    @property
    def watchdog_interval_s(self) -> float | None:
        return self._interval

    def _send(self, *lines: str) -> bool:
        self.messages.append("\n".join(lines))
        return True

    def ready(self, status: str | None = None) -> bool:
        return self._send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self._send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self._send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        return self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def stopping(self, status: str | None = None) -> bool:
        return self._send("STOPPING=1", *([f"STATUS={status}"] if status else []))


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
    """core.ports.GpuSensor whose snapshot a function of the fake clock computes."""

    def __init__(
        self, clock: FakeClock, snapshot: Callable[[float], tuple[GpuState, ...] | None]
    ) -> None:
        self.clock = clock
        self.snapshot = snapshot
        self.reads = 0
        self.closed = 0

    def read_gpus(self) -> tuple[GpuState, ...] | None:
        self.reads += 1
        return self.snapshot(self.clock.now)

    def close(self) -> None:
        self.closed += 1


class RecordingResetter:
    """core.ports.GpuResetter that records resets and runs `on_reset` (the GPU gets clean)."""

    def __init__(self, ok: bool = True, on_reset: Callable[[int], None] | None = None) -> None:
        self.ok = ok
        self.calls: list[tuple[int, str]] = []
        self.on_reset = on_reset

    def reset(self, index: int, uuid: str) -> ResetOutcome:
        self.calls.append((index, uuid))
        if self.on_reset is not None:
            self.on_reset(index)
        return ResetOutcome(ok=self.ok, detail="" if self.ok else "in use")
