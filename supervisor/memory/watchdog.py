"""The host-memory watchdog thread: read → core.policy.decide → act → tell the runner.

Runs beside the runner's main loop (which may sit in a 25 s health check) and acts on its own:
in a memory emergency it SIGKILLs the whole server tree at once (the server handle's kill_all:
cgroup.kill, or the group and every member's pidfd, each followed by process_mrelease at once),
writes the incident and posts a WatchdogEvent; the runner classifies the death as memory_kill,
waits for the GPUs (run/gpu_wait.py) and relaunches smaller (memory/restart_smaller.py). The
smaller `--hicache-size` is written before the tree is signalled (`keep_shrink`), so a
supervisor that dies before the classification still relaunches smaller. It never queries NVML:
the GPU snapshot in an incident is the guard's last one.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.host import HostProbe, HostReadError
from supervisor.adapters.psi import MemoryPressure, read_memory_pressure
from supervisor.core.classify import FailureKind
from supervisor.core.events import KillReason, MemoryAction, WatchdogEvent
from supervisor.core.policy import Decision, Limits, Reading, Verdict, decide
from supervisor.core.ports import Clock, ServerHandle
from supervisor.core.readings import GpuState, HostMemory, ProcessInfo
from supervisor.memory.incident import Incident, memory_report

log = structlog.get_logger("supervisor.watchdog")

HISTORY_TICKS = 64
# A full /proc scan finds new processes of the tree; between scans only known PIDs are read
# (~30 µs each instead of ~3 ms for a scan of ~150 processes).
RESCAN_S = 1.0
IDLE_RESCAN_FACTOR = 5
REPORT_INTERVAL_S = 60.0
# How long the watchdog itself waits to see the killed tree disappear (for the incident only).
GONE_WAIT_S = 10.0


HostSource = Callable[[Sequence[ProcessInfo]], HostMemory]


def system_host_source(server_pid: int, probe: HostProbe | None = None) -> HostSource:
    """MemAvailable from /proc/meminfo, capped by the server cgroup's headroom when it has a
    limit (looked up once: a server without a limit costs one meminfo read per tick)."""
    host = probe or HostProbe()
    limited = host.read_cgroup_headroom(str(server_pid)).headroom_bytes is not None

    def read(_tree: Sequence[ProcessInfo]) -> HostMemory:
        mem = host.read_meminfo()
        if not limited:
            return mem
        headroom = host.read_cgroup_headroom(str(server_pid)).headroom_bytes
        return dataclasses.replace(mem, cgroup_headroom_bytes=headroom)

    return read


class MemoryWatchdog:
    """One watchdog per launched server; `start()` after launch, `stop()` before the next."""

    def __init__(
        self,
        server: ServerHandle,
        limits: Limits,
        *,
        post: Callable[[WatchdogEvent], None],
        read_host: HostSource | None = None,
        read_psi: Callable[[], MemoryPressure | None] = read_memory_pressure,
        tree_view: Callable[[tuple[ProcessInfo, ...]], tuple[ProcessInfo, ...]] | None = None,
        gpu_snapshot: Callable[[], tuple[float, tuple[GpuState, ...] | None] | None] | None = None,
        state_dir: Path | None = None,
        run_id: str = "",
        clock: Clock | None = None,
        rescan_s: float = RESCAN_S,
        incident_log_lines: int = 200,
        keep_files: int = 100,
        keep_shrink: Callable[[bool], None] | None = None,
    ) -> None:
        self.server = server
        self.limits = limits
        self.post = post
        self.read_host = read_host or system_host_source(server.pid)
        self.read_psi = read_psi
        self.tree_view = tree_view or (lambda tree: tree)
        self._plain_view = tree_view is None
        self.gpu_snapshot = gpu_snapshot
        self.state_dir = state_dir
        self.run_id = run_id
        self.clock: Clock = clock or SystemClock()
        self.rescan_s = rescan_s
        self.incident_log_lines = incident_log_lines
        self.keep_files = keep_files
        self.keep_shrink = keep_shrink
        self._scanned_pids: frozenset[int] = frozenset()
        self._members_settled = False
        self.history: collections.deque[Reading] = collections.deque(maxlen=HISTORY_TICKS)
        self.tree: tuple[ProcessInfo, ...] = ()
        self._raw: tuple[ProcessInfo, ...] = ()
        self.streak = 0
        self.terminated_at_s: float | None = None
        self.killed_at_s: float | None = None
        # Set while a kill or terminate is being acted on and reported: the run loop may learn
        # of the death (the tree's exit events) before the incident is written.
        self.acting = threading.Event()
        self.reported = threading.Event()
        self.gone_at_s: float | None = None
        self.incident: Incident | None = None
        self.last: Decision | None = None
        self.ticks = 0
        self._last_scan_s = float("-inf")
        self._last_report_s = float("-inf")
        self._last_verdict = Verdict.OK
        self._host_error_logged = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Every event of this watchdog names its run and server like the main loop's: they are
        # bound to its logger and in its thread's context (incident.py logs there too), since a
        # thread sees none of the main thread's contextvars.
        self._context = {"run_id": run_id, "server_pid": server.pid}

    @property
    def log(self) -> Any:
        """The logger with this run's fields, under the logging configuration in force now (a
        logger bound once would keep the level and format of its day)."""
        return log.bind(**self._context)

    # -- thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="memory-watchdog", daemon=True)
        self._thread.start()

    def wait_reported(self, timeout_s: float = 5.0) -> None:
        """If a kill or terminate is under way, wait until its incident is written and posted."""
        if self.acting.is_set():
            self.reported.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        structlog.contextvars.bind_contextvars(**self._context)
        self.log.info("watchdog_started")
        while not self._stop.is_set():
            try:
                decision = self.tick()
            except Exception:  # the watchdog must outlive a bad tick (logged with traceback)
                self.log.exception("watchdog_tick_failed")
                self._stop.wait(1.0)
                continue
            if self.killed_at_s is not None:
                self._after_kill()
                return
            self._stop.wait(decision.next_interval_s)

    # -- one tick ----------------------------------------------------------------------------

    def read(self) -> Reading:
        """Read the tree (known PIDs, or a full scan when due), host memory and PSI."""
        now = self.clock.monotonic()
        # Near a threshold (short intervals) new members are looked for every second; an idle
        # box rescans every few seconds (the scan is ~3 ms for 150 processes).
        # A tree whose membership still changes (ranks spawning while the server loads) is
        # rescanned every rescan_s: otherwise ranks found late show their whole pinned pool as
        # one tick's growth, and the trend term reads hundreds of GB/s.
        idle = (
            self._members_settled
            and self.last is not None
            and self.last.next_interval_s >= self.limits.max_interval_s
        )
        rescan_s = self.rescan_s * (IDLE_RESCAN_FACTOR if idle else 1)
        if now - self._last_scan_s >= rescan_s or not self._raw:
            raw = self.server.tree()
            self._last_scan_s = now
            pids = frozenset(p.pid for p in raw)
            self._members_settled = pids == self._scanned_pids
            self._scanned_pids = pids
        else:
            raw = self.server.refresh(self._raw)
        self._raw = raw
        self.tree = self.tree_view(raw)
        # The cgroup's own charge when it has one (one read, escapees included); a test's
        # tree_view rescales members, so its sum is used then.
        kernel = self.server.charged_bytes() if self._plain_view else None
        charged = kernel if kernel is not None else sum(p.charged_bytes for p in self.tree)
        try:
            host = self.read_host(self.tree)
            available = host.usable_bytes
        except HostReadError as exc:
            if not self._host_error_logged:
                self.log.error("watchdog_degraded", reason=f"host memory unreadable: {exc}")
                self._host_error_logged = True
            available = self.history[-1].available_bytes if self.history else 1 << 62
        psi = self.read_psi()
        reading = Reading(
            t_s=now,
            available_bytes=available,
            tree_charged_bytes=charged,
            psi_some_avg10=psi.some_avg10 if psi else None,
            psi_full_avg10=psi.full_avg10 if psi else None,
        )
        self.history.append(reading)
        return reading

    def tick(self) -> Decision:
        """Read, decide, act once. Returns the decision (its next_interval_s paces the loop)."""
        self.ticks += 1
        streak = self.streak
        self.read()
        decision = self._decide()
        if decision.verdict is Verdict.KILL:
            # earlyoom's re-check: memory may have come back while we were deciding. The
            # re-read is part of this tick: it does not count as another warn breach.
            self.streak = streak
            self.read()
            recheck = self._decide()
            if recheck.verdict is Verdict.KILL:
                self._kill(recheck)
                return recheck
            self.log.info("memory_kill_averted", reason=decision.reason, now=recheck.reason)
            decision = recheck
        if decision.verdict is Verdict.TERMINATE and self.terminated_at_s is None:
            self._terminate(decision)
        elif decision.verdict is Verdict.WARN and self._last_verdict is not Verdict.WARN:
            self.log.warning("memory_warn", reason=decision.reason, **self._numbers())
        self._last_verdict = decision.verdict
        now = self.history[-1].t_s
        if now - self._last_report_s >= REPORT_INTERVAL_S:
            self._last_report_s = now
            self.log.info(
                "memory_report", interval_s=round(decision.next_interval_s, 3), **self._numbers()
            )
        return decision

    def _decide(self) -> Decision:
        decision = decide(
            list(self.history),
            self.limits,
            streak=self.streak,
            terminated_at_s=self.terminated_at_s,
        )
        self.streak = decision.streak
        self.last = decision
        return decision

    def _numbers(self) -> dict[str, int]:
        r = self.history[-1]
        return {"available_bytes": r.available_bytes, "tree_charged_bytes": r.tree_charged_bytes}

    # -- acting ------------------------------------------------------------------------------

    def _keep_shrink(self, urgent: bool) -> None:
        """Have the restart-smaller size written; a failure is logged, never stops a kill."""
        if self.keep_shrink is None:
            return
        try:
            self.keep_shrink(urgent)
        except Exception:  # the kill matters more than the size (logged with its traceback)
            self.log.exception("hicache_shrink_not_saved")

    def _kill(self, decision: Decision) -> None:
        self.acting.set()
        self.reported.clear()
        self._keep_shrink(urgent=True)  # no fsync, no waiting: the kill goes first
        pids = self.server.kill_all(KillReason(FailureKind.MEMORY_KILL, decision.reason))
        self.killed_at_s = self.clock.monotonic()
        self.log.error(
            "server_killed",
            cause="memory_kill",
            reason=decision.reason,
            pids=list(pids),
            predicted=decision.predicted,
            mrelease=self.server.memory_released,
            **self._numbers(),
        )
        self._keep_shrink(urgent=False)  # now durably (a no-op if the SIGTERM's write was)
        self.incident = self._write_incident("memory_kill", decision)
        if self.incident is not None and self.terminated_at_s is not None:
            self.incident.record_next("escalated_from_terminate")
        self.post(
            WatchdogEvent(
                action=MemoryAction.KILLED,
                failure=FailureKind.MEMORY_KILL,
                reason=decision.reason,
                at_s=self.killed_at_s,
                pids=tuple(pids),
                incident_path=str(self.incident.path) if self.incident else None,
                predicted=decision.predicted,
            )
        )
        self.reported.set()

    def _terminate(self, decision: Decision) -> None:
        self.acting.set()
        self.reported.clear()
        self._keep_shrink(urgent=False)  # a SIGTERM has its grace: written durably first
        self.server.terminate(KillReason(FailureKind.MEMORY_KILL, decision.reason))
        self.terminated_at_s = self.clock.monotonic()
        self.log.error(
            "server_terminated",
            cause="memory_terminate",
            reason=decision.reason,
            grace_s=self.limits.terminate_grace_s,
            **self._numbers(),
        )
        self.incident = self._write_incident("memory_terminate", decision)
        self.post(
            WatchdogEvent(
                action=MemoryAction.TERMINATED,
                failure=FailureKind.MEMORY_KILL,
                reason=decision.reason,
                at_s=self.terminated_at_s,
                pids=tuple(p.pid for p in self.tree),
                incident_path=str(self.incident.path) if self.incident else None,
            )
        )
        self.reported.set()

    def _write_incident(self, kind: str, decision: Decision) -> Incident | None:
        if self.state_dir is None:
            return None
        details = memory_report(
            decision=decision,
            limits=self.limits,
            history=list(self.history)[-20:],
            tree=self.tree,
            gpus=self.gpu_snapshot() if self.gpu_snapshot is not None else None,
            log_tail=self.server.tail()[-self.incident_log_lines :]
            if self.incident_log_lines
            else (),
            now_s=self.clock.monotonic(),
        )
        details["run_id"] = self.run_id
        details["server_pid"] = self.server.pid
        return Incident.create(
            self.state_dir, kind, decision.reason, details, self.clock, keep=self.keep_files
        )

    def _after_kill(self) -> None:
        """Watch the killed tree disappear, for the incident's "what happened next"."""
        if self.killed_at_s is None:
            return
        deadline = self.killed_at_s + GONE_WAIT_S
        while not self._stop.is_set() and self.clock.monotonic() < deadline:
            left = [p for p in self.server.tree() if not p.is_zombie]
            if not left:
                self.gone_at_s = self.clock.monotonic()
                elapsed_ms = round((self.gone_at_s - self.killed_at_s) * 1000, 1)
                self.log.info("server_tree_gone", after_ms=elapsed_ms)
                if self.incident is not None:
                    self.incident.record_next("tree_gone", after_ms=elapsed_ms)
                return
            self._stop.wait(0.01)
        if self.incident is not None:
            left_pids = [p.pid for p in self.server.tree()]
            self.incident.record_next("tree_not_gone", after_s=GONE_WAIT_S, pids=left_pids)
