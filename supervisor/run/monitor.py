"""One launched server, watched tick by tick: exit status, rank processes, health, startup
progress. Returns what it saw; the runner (supervisor/run/runner.py) changes state and acts.

Health probes run on a worker thread (a probe may take the full 25 s timeout) so that a tick,
and with it signal handling and rank checks, never waits on HTTP. Tests hand in an executor
that runs the probe at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from supervisor.config import RunConfig
from supervisor.core.classify import FailureKind
from supervisor.core.events import Wake, WakeEvent
from supervisor.core.lifecycle import (
    HealthStatus,
    ServerState,
    StartupVerdict,
    StartupWatch,
    state_for_startup_probe,
)
from supervisor.core.listen import probe_host
from supervisor.core.listener import PortCheck, PortOwner, foreign_detail
from supervisor.core.liveness import RankProblem, judge_ranks
from supervisor.core.ports import Clock, LaunchedServer
from supervisor.core.readings import GpuState, ProcessInfo
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import MiB
from supervisor.run.death import Death
from supervisor.run.plugins import RunnerIO

log = structlog.get_logger("supervisor.run")

# Memory counts as load progress only when it passes the previous peak by this much: a loading
# rank grows by GBs, an idle Python process wobbles by a few MiB.
PROGRESS_MIN_GROWTH_BYTES = 64 * MiB
# Readiness polling while loading: a ready server is noticed within this (the answer wakes the
# loop when it arrives); cheap for a 20-min load, as /proc is rescanned at most once a second.
# A refused connection or a 503 comes back at once; SGLang's 200 takes at least 1 s (/health is
# a generation its handler first looks at after sleeping 1 s) and the next probe starts only
# after the last answered, so once SGLang is up the poll is in effect 1 s or slower.
STARTUP_POLL_S = 0.2
# Once ready the tree is stable: the ranks are re-read from /proc/PID/status every tick and the
# whole of /proc rescanned this often. A full scan every second was ~0.3 % of a core at idle,
# most of the supervisor's idle cost; kill_all() rescans on its own, so escapees are still found.
READY_RESCAN_S = 10.0
# Once ready a rank's death is an event (its pidfd); the tick still catches a stopped rank (T).
READY_TICK_S = 1.0

_RANK_KIND = {
    RankProblem.MISSING: FailureKind.RANK_CRASH,
    RankProblem.DIED: FailureKind.RANK_CRASH,
    RankProblem.ZOMBIE: FailureKind.RANK_ZOMBIE,
    RankProblem.STOPPED: FailureKind.RANK_STOPPED,
}


@dataclass(frozen=True, slots=True)
class TickResult:
    death: Death | None = None
    new_state: ServerState | None = None  # a startup state change the probe revealed
    progressed_s_left: float | None = None  # while loading: seconds until the startup deadline
    pinned_bytes: int | None = None  # while loading: anon + shmem of the tree (off MemAvailable)


class LaunchMonitor:
    """Tick logic for one launch; owns the probe thread and the startup watch."""

    def __init__(
        self,
        server: LaunchedServer,
        *,
        run: Callable[[], RunConfig],
        expected_ranks: int,
        probe: Callable[[], HealthStatus],
        clock: Clock,
        gpu_used_bytes: Callable[[], int] | None = None,
        executor: concurrent.futures.Executor | None = None,
        wake: Callable[[], None] = lambda: None,
        port_check: Callable[[int, tuple[int, ...]], PortCheck] | None = None,
        address: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self.server = server
        self._run = run
        self.expected_ranks = expected_ranks
        self.clock = clock
        self.gpu_used_bytes = gpu_used_bytes
        self._probe = probe
        self._wake = wake
        self._pool = executor or concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="health-probe"
        )
        self._pending: concurrent.futures.Future[tuple[HealthStatus, float]] | None = None
        self._last_probe_s = float("-inf")
        self.watch = StartupWatch.begin(clock.monotonic())
        self.state = ServerState.LAUNCHING
        self.all_ranks_seen = False
        self.failures = 0
        self.ready_since_s: float | None = None
        self._tree: tuple[ProcessInfo, ...] = ()
        self._scanned_s = float("-inf")
        # (main pid, tree pids) -> who holds the port; None: not checked (tests' fake servers).
        self._port_check = port_check
        self.address = address  # where the probe connects: (host, port)

    @property
    def run(self) -> RunConfig:
        """The [run] settings, read at each use: a reload (SIGHUP) applies at the next tick."""
        return self._run()

    @property
    def tick_s(self) -> float:
        if self.state is ServerState.READY:
            return min(READY_TICK_S, self.run.health_interval_s)
        return min(STARTUP_POLL_S, self.run.health_interval_s)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def tick(self) -> TickResult:
        """Read everything once and say what changed."""
        now = self.clock.monotonic()
        status = self.server.poll()
        if status is not None:
            return TickResult(death=Death(None, "the server's main process exited"))
        tree = self._read_tree(now)
        verdict = judge_ranks(tree, self.expected_ranks, self.all_ranks_seen)
        if verdict.problem is RankProblem.OK:
            self.all_ranks_seen = True
        if verdict.is_dead:
            return TickResult(death=Death(_RANK_KIND[verdict.problem], verdict.detail))
        answer = self._collect_probe()
        if answer is HealthStatus.NOT_FOUND:  # a wrong path never starts answering 200
            detail = f"GET {self.run.health_path} answered 404"
            return TickResult(death=Death(FailureKind.HEALTH_PATH_MISSING, detail))
        if self.state is ServerState.READY:
            return self._liveness(answer)
        result = self._startup(
            answer, now, tree_bytes=sum(p.charged_bytes + p.rss_file_bytes for p in tree)
        )
        return dataclasses.replace(result, pinned_bytes=sum(p.charged_bytes for p in tree))

    def mark_state(self, state: ServerState) -> None:
        self.state = state
        if state is ServerState.READY:
            self.ready_since_s = self.clock.monotonic()
            self.all_ranks_seen = True
            self.server.mark_ready()
            # From now on every rank must be there: read them all once more.
            self._tree = self.server.tree()
            self._scanned_s = self.ready_since_s

    def _read_tree(self, now: float) -> tuple[ProcessInfo, ...]:
        if self.state is ServerState.READY and now - self._scanned_s < READY_RESCAN_S:
            self._tree = self.server.refresh(self._tree)
        else:
            self._tree = self.server.tree()
            self._scanned_s = now
        return self._tree

    # -- startup -------------------------------------------------------------------------

    def _startup(self, answer: HealthStatus | None, now: float, tree_bytes: int) -> TickResult:
        self._maybe_probe(now, interval_s=self.tick_s)
        gpu = self.gpu_used_bytes() if self.gpu_used_bytes is not None else 0
        self.watch = self.watch.observe(
            now, tree_bytes + gpu, self.server.output_lines, PROGRESS_MIN_GROWTH_BYTES
        )
        new_state = state_for_startup_probe(answer) if answer is not None else None
        if new_state is ServerState.WARMING and self.state is ServerState.WARMING:
            new_state = None
        if new_state is None and self.state is ServerState.LAUNCHING:
            new_state = ServerState.LOADING
        if new_state is ServerState.READY:
            foreign = self._foreign_port()
            return TickResult(death=foreign) if foreign else TickResult(new_state=new_state)
        run = self.run
        verdict = self.watch.verdict(now, run.startup_stall_timeout_s, run.startup_timeout_s)
        if verdict is StartupVerdict.STALLED:
            detail = f"no progress for {run.startup_stall_timeout_s:g} s while loading"
            return TickResult(death=Death(FailureKind.STARTUP_STALL, detail))
        if verdict is StartupVerdict.TIMED_OUT:
            detail = f"not ready after {run.startup_timeout_s:g} s"
            return TickResult(death=Death(FailureKind.STARTUP_TIMEOUT, detail))
        left = self.watch.time_left_s(now, run.startup_stall_timeout_s, run.startup_timeout_s)
        return TickResult(new_state=new_state, progressed_s_left=left)

    def _foreign_port(self) -> Death | None:
        """A 200 from a socket the tree does not hold is another server's: SGLang could not bind
        its port and will exit 3 (core/listener.py). Never ready for it: a death, named."""
        if self._port_check is None:
            return None
        check = self._port_check(self.server.pid, tuple(p.pid for p in self._tree))
        verdict = check.verdict
        host, port = self.address
        if verdict.owner is PortOwner.UNKNOWN:
            log.warning("port_unverified", port=port, detail="no TCP table readable in /proc")
            return None
        if verdict.owner is PortOwner.OURS:
            return None
        detail = foreign_detail(host, port, verdict, check.holder_pid)
        inode = verdict.foreign[0].inode if verdict.foreign else None
        log.warning(
            "foreign_listener", port=port, holder_pid=check.holder_pid, socket=inode, detail=detail
        )
        return Death(FailureKind.PORT_IN_USE, detail)

    # -- after ready ---------------------------------------------------------------------

    def _liveness(self, answer: HealthStatus | None) -> TickResult:
        self._maybe_probe(self.clock.monotonic(), interval_s=self.run.health_interval_s)
        if answer is None:
            return TickResult()
        if answer is HealthStatus.READY:
            self.failures = 0
            return TickResult()
        self.failures += 1
        if self.failures >= self.run.failure_threshold:
            # After ready a 503 is no warm-up: say what the server answered.
            last = "503" if answer is HealthStatus.WARMING else answer.value
            detail = f"{self.failures} consecutive failed health checks (last: {last})"
            return TickResult(death=Death(FailureKind.HEALTH_TIMEOUT, detail))
        return TickResult()

    # -- probe thread --------------------------------------------------------------------

    def _maybe_probe(self, now: float, interval_s: float) -> None:
        if self._pending is None and now - self._last_probe_s >= interval_s:
            self._last_probe_s = now
            self._pending = self._pool.submit(self._timed_probe)
            # The answer wakes the run loop at once, not at its next tick.
            self._pending.add_done_callback(lambda _done: self._wake())

    def _collect_probe(self) -> HealthStatus | None:
        if self._pending is None or not self._pending.done():
            return None
        future, self._pending = self._pending, None
        try:
            answer, duration_s = future.result()
        except Exception:  # noqa: BLE001 - a probe bug counts as a failed check, never a crash
            answer, duration_s = HealthStatus.ERROR, None
        # Each probe is a debug event: below the usual level, but the metrics see it (the tap).
        state = self.state.value
        log.debug("health_check", result=answer.value, duration_s=duration_s, state=state)
        return answer

    def _timed_probe(self) -> tuple[HealthStatus, float]:
        started_s = self.clock.monotonic()
        answer = self._probe()
        return answer, round(self.clock.monotonic() - started_s, 6)


def gpu_used_on(gpus: tuple[GpuState, ...] | None, indices: tuple[int, ...]) -> int:
    wanted = set(indices)
    return sum(g.used_bytes for g in gpus or () if g.index in wanted)


def monitor_for(
    server: LaunchedServer, io: RunnerIO, run: Callable[[], RunConfig], plan: LaunchPlan
) -> LaunchMonitor:
    """The monitor of one launch, wired to the runner's probe, GPUs, executor and queue."""
    sensor = io.sensor
    make_executor = io.probe_executor
    port_check = io.port_check
    target = probe_host(plan.host)
    return LaunchMonitor(
        server,
        run=run,
        expected_ranks=plan.local_ranks,
        probe=io.probe_factory(plan),
        clock=io.clock,
        gpu_used_bytes=(
            (lambda: gpu_used_on(sensor.read_gpus(), plan.local_gpu_ids()))
            if sensor is not None
            else None
        ),
        executor=make_executor() if make_executor is not None else None,
        wake=lambda: io.events.put(WakeEvent(Wake.PROBE_DONE)),
        port_check=(
            (lambda main, pids: port_check(main, pids, target, plan.port))
            if port_check is not None
            else None
        ),
        address=(target, plan.port),
    )
