"""A launched server the test kills, stops or ends; its launcher; probes."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from supervisor.core.events import KillReason
from supervisor.core.lifecycle import HealthStatus
from supervisor.core.readings import ExitStatus, ProcessInfo


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
        self.kernel_charged_bytes: int | None = None  # what a cgroup would say; None: /proc
        self.tree_oom_kills: int | None = None  # the cgroup's oom_kill count; None: /proc
        self.ready_marked = False
        self.notify_exit: Callable[[], None] | None = None  # the runner's exit callback
        self.seen: dict[int, int] = {}
        # Where a line the server prints later goes (the launcher's sink, as the pump feeds it).
        self.sink: Callable[[str], None] = lambda line: None

    # -- what the test does ----------------------------------------------------------------

    def crash_rank(self, index: int = 0) -> None:
        """A rank dies: it leaves the tree (SGLang's main process lives on for a while)."""
        del self.ranks[self._pid + 1 + index]

    def set_rank_state(self, index: int, state: str) -> None:
        pid = self._pid + 1 + index
        self.ranks[pid] = dataclasses.replace(self.ranks[pid], state=state)

    def say(self, line: str) -> None:
        """The server prints a line (its main process's output, read by the pump)."""
        self.lines.append(line)
        self.sink(line)

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
        infos = main + tuple(self.ranks.values())
        self.seen.update({p.pid: p.start_ticks for p in infos})
        return infos

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

    def charged_bytes(self) -> int | None:
        return self.kernel_charged_bytes

    def oom_kill_count(self) -> int | None:
        return self.tree_oom_kills

    @property
    def memory_released(self) -> int:
        return 0

    @property
    def mode(self) -> str:
        return "fake"

    def mark_ready(self) -> None:
        self.ready_marked = True

    def members_seen(self) -> Mapping[int, int]:
        return dict(self.seen)

    def watch_exits(self, notify: Callable[[], None]) -> None:
        self.notify_exit = notify


class FakeLauncher:
    """core.ports.ServerLauncher: hands out FakeServers with 8 ranks (or `ranks`)."""

    def __init__(self, ranks: int = 2, first_pid: int = 1000) -> None:
        self.ranks = ranks
        self.next_pid = first_pid
        self.started: list[FakeServer] = []
        self.argvs: list[tuple[str, ...]] = []
        self.envs: list[Mapping[str, str]] = []
        self.on_start: Callable[[FakeServer], None] | None = None
        self.output: list[str] = []  # lines every server prints as it starts

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
        server = FakeServer(self.next_pid, run_id, self.ranks, self.output)
        server.sink = lambda line: sink(redact(line))
        for line in self.output:
            sink(redact(line))
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
