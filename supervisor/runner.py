"""`sglang-supervisor run`: the supervision loop.

    leftovers of an earlier run -> [GPU release] -> pre-flight gate -> launch -> readiness ->
    liveness -> (stop | death -> classify -> backoff -> [GPU release] -> relaunch)

Short named steps over the adapters; decisions come from supervisor/core. Signals and component
events (the memory watchdog) arrive on one queue.SimpleQueue; the loop is the only place that
changes the server's state (one event per change, run_id bound).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import structlog

from supervisor import cleanup, launch
from supervisor.adapters.procfs import ProcReader
from supervisor.adapters.server_process import ExitStatus, ServerProcess, become_subreaper
from supervisor.adapters.systemd import SdNotifier
from supervisor.core.backoff import BackoffPolicy, RestartBudget
from supervisor.core.classify import Classification, DeathContext, FailureKind, classify
from supervisor.core.lifecycle import HealthStatus, ServerState, check_transition
from supervisor.core.redact import Redactor, secret_values
from supervisor.core.sglang_args import LaunchPlan, parse_launch_args, redact_argv
from supervisor.errors import (
    ConfigError,
    CrashLoop,
    ExitCode,
    GpuUnrecoverable,
    PreflightFailed,
    ServerArgsRejected,
    StartupFailed,
)
from supervisor.monitor import Death, LaunchMonitor, gpu_used_on
from supervisor.ports import Clock, GpuResetter, GpuSensor
from supervisor.run_events import (
    Event,
    EventClock,
    SignalEvent,
    StopRequested,
    install_signal_handlers,
)
from supervisor.state import ProcessRef, RunState, StateStore

log = structlog.get_logger("supervisor.run")

# After SIGKILL the tree normally vanishes in milliseconds; ranks unpinning huge pools sit in D
# state for tens of seconds (sglang PR #32829) - the GPU release wait covers those.
TREE_GONE_WAIT_S = 10.0


class Component(Protocol):
    """Something started beside a launched server (the memory watchdog); stopped before the
    next launch. It may kill the tree itself (server.kill_all) and post an event."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = ...) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LaunchInfo:
    """What a component factory gets to know about a launch."""

    run_id: str
    argv: tuple[str, ...]  # launch_server's argv as launched (override/auto-size applied)
    plan: LaunchPlan  # parsed from that argv
    expected_total_bytes: int | None  # the pre-flight's host total for the tree, when it ran
    state_dir: str


# (server, post, info) -> component; `post` puts an event on the runner's queue (any thread).
ComponentFactory = Callable[[ServerProcess, Callable[[Any], None], LaunchInfo], "Component | None"]
# Called after every death, classified, before the restart decision (e.g. restart smaller).
DeathHook = Callable[["DeathReport"], None]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeathReport:
    run_id: str
    classification: Classification
    exit_status: ExitStatus | None
    was_ready: bool
    pids: tuple[int, ...]
    plan: LaunchPlan
    argv: tuple[str, ...]
    store: StateStore


class Runner:
    def __init__(
        self,
        settings: launch.RunSettings,
        *,
        clock: Clock,
        store: StateStore,
        sensor: GpuSensor | None = None,
        notifier: SdNotifier | None = None,
        proc: ProcReader | None = None,
        probe_factory: Callable[[LaunchPlan], Callable[[], HealthStatus]],
        components: Sequence[ComponentFactory] = (),
        death_hooks: Sequence[DeathHook] = (),
        resetter: GpuResetter | None = None,
        events: queue.SimpleQueue[Event] | None = None,
    ) -> None:
        self.settings = settings
        self.run_cfg = settings.run
        self.events: queue.SimpleQueue[Event] = events or queue.SimpleQueue()
        self.clock = clock
        self.wait_clock = EventClock(clock, self.events, on_tick=self._feed_watchdog)
        self.store = store
        self.sensor = sensor
        self.notifier = notifier or SdNotifier()
        self.proc = proc or ProcReader()
        self.probe_factory = probe_factory
        self.components = components
        self.death_hooks = death_hooks
        self.resetter = resetter
        self.baselines: dict[str, int] = {}
        self.stop_reason = "signal"
        self.expected_total_bytes: int | None = None
        self.run_id = ""
        self.state = ServerState.STOPPED
        self.budget = RestartBudget(
            BackoffPolicy(
                initial_s=self.run_cfg.backoff_initial_s,
                max_s=self.run_cfg.backoff_max_s,
                stable_after_s=self.run_cfg.stable_after_s,
                max_restarts=self.run_cfg.max_restarts,
                restart_window_s=self.run_cfg.restart_window_s,
            )
        )
        self.plan = parse_launch_args(settings.server_args)
        env = dict(settings.config.server.env)
        self.redact = Redactor(secret_values(self.plan, env))
        self._last_ping_s = float("-inf")
        self._launched_argv: tuple[str, ...] | None = None

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> ExitCode:
        """Supervise until stopped (0) or a failure that ends the run (raises SupervisorError)."""
        install_signal_handlers(self.events)
        become_subreaper()
        state = self.store.load()
        try:
            self.clean_leftovers(state)
            if self.sensor is not None:
                self.baselines = cleanup.measure_baselines(self.sensor, self.plan.local_gpu_ids())
            while True:
                death = self.supervise_once()
                if death is None:
                    return ExitCode.OK
                delay_s = self.decide_restart(death)
                if not self.backoff(delay_s):
                    return ExitCode.OK
                self.wait_gpus_released(death.pids)
        except StopRequested as stop:
            self.stopped_while_waiting(stop.event.name)
            return ExitCode.OK

    def supervise_once(self) -> DeathReport | None:
        """One launch, watched until it dies (the report) or a stop signal (None)."""
        argv = self.prepare_argv()
        server = self.launch(argv)
        info = LaunchInfo(
            run_id=self.run_id,
            argv=argv,
            plan=parse_launch_args(argv),
            expected_total_bytes=self.expected_total_bytes,
            state_dir=str(self.settings.state_dir),
        )
        started: list[Component] = []
        monitor = LaunchMonitor(
            server,
            run=self.run_cfg,
            expected_ranks=self.plan.local_ranks,
            probe=self.probe_factory(self.plan),
            clock=self.clock,
            gpu_used_bytes=self._gpu_used if self.sensor is not None else None,
        )
        oom_kills_at_launch = self.proc.oom_kill_count()
        try:
            started = [c for f in self.components if (c := f(server, self.events.put_nowait, info))]
            for component in started:
                component.start()
            death = self.watch(server, monitor)
            if death is None:
                self.stop_server(server)
                return None
            return self.handle_death(server, monitor, death, argv, oom_kills_at_launch)
        except BaseException:
            # A bug or an interrupt must not leave the tree running (PDEATHSIG would take the
            # server only once this process is gone, and not its escapees).
            server.kill_all("stop", "supervisor error")
            self.wait_tree_gone(server)
            raise
        finally:
            monitor.close()
            for component in started:
                component.stop()
            server.close()

    def watch(self, server: ServerProcess, monitor: LaunchMonitor) -> Death | None:
        """Tick until the server dies (its Death) or a stop signal arrives (None)."""
        while True:
            event = self.next_event(monitor.tick_s)
            if isinstance(event, SignalEvent):
                self.stop_reason = event.name
                return None
            if event is not None:
                death = self.on_component_event(server, event)
                if death is not None:
                    return death
                continue
            result = monitor.tick()
            self._feed_watchdog()
            if result.death is not None:
                return result.death
            if result.new_state is not None and result.new_state is not self.state:
                self.advance_startup(monitor, result.new_state)
            if result.progressed_s_left is not None:
                self.notifier.extend_timeout(result.progressed_s_left + 30.0)
            if monitor.ready_since_s is not None:
                self.budget = self.budget.on_healthy(monitor.ready_since_s, self.clock.monotonic())

    # -- steps ---------------------------------------------------------------------------

    def clean_leftovers(self, state: RunState) -> None:
        """Kill processes of an earlier run of this instance and wait for their GPUs."""
        gpus = self.sensor.read_gpus() if self.sensor is not None else None
        indices = self.plan.local_gpu_ids()
        found = launch.find_leftovers(self.proc, state, self.settings.instance, gpus, indices)
        if found:
            log.warning(
                "leftovers_found",
                pids=[p.pid for p in found],
                titles=[p.title[:60] for p in found],
                previous_run_id=state.run_id or None,
            )
            left = launch.kill_processes(
                found, self.proc, self.wait_clock, launch.LEFTOVER_EXIT_WAIT_S
            )
            log.warning("leftovers_killed", pids=[p.pid for p in found], still_present=list(left))
            self.wait_gpus_released(tuple(p.pid for p in found))
            gpus = self.sensor.read_gpus() if self.sensor is not None else None
        foreign = launch.foreign_gpu_holders(self.proc, gpus, indices)
        if foreign and self.run_cfg.kill_foreign_gpu_processes:
            log.warning("foreign_gpu_processes_killed", pids=[p.pid for p in foreign])
            launch.kill_processes(foreign, self.proc, self.wait_clock, launch.LEFTOVER_EXIT_WAIT_S)
            self.wait_gpus_released(tuple(p.pid for p in foreign))
        elif foreign:
            named = ", ".join(f"pid {p.pid} ({p.title[:40]})" for p in foreign)
            raise PreflightFailed(
                f"other processes use the target GPUs {list(indices)}: {named}; stop them or "
                "pass --kill-foreign-gpu-processes"
            )

    def prepare_argv(self) -> tuple[str, ...]:
        """The argv of this launch: the watchdog's override, then the pre-flight gate (first
        launch, and whenever the argv changed)."""
        argv = launch.apply_override(self.settings.server_args, self.store.load())
        if self._launched_argv is None or argv != self._launched_argv:
            argv, report = launch.preflight_gate(self.settings, argv, self.sensor)
            if report is not None:
                self.expected_total_bytes = report.host_required_bytes
        return argv

    def launch(self, argv: tuple[str, ...]) -> ServerProcess:
        self.run_id = uuid.uuid4().hex[:12]
        structlog.contextvars.bind_contextvars(run_id=self.run_id)
        command = (*self.settings.server_command, *argv)
        self.set_state(ServerState.LAUNCHING, argv=list(redact_argv(argv)))
        server_log = log.bind(run_id=self.run_id)
        try:
            server = ServerProcess.start(
                command,
                launch.server_env(self.settings, self.run_id),
                run_id=self.run_id,
                sink=lambda line: server_log.info("server_output", line=line),
                redact=self.redact,
                oom_score_adj=self.run_cfg.oom_score_adj,
                proc=self.proc,
            )
        except OSError as exc:
            raise ConfigError(
                f"server command {command[0]} cannot be executed: {exc.strerror or exc}"
            ) from None
        self._launched_argv = argv
        structlog.contextvars.bind_contextvars(server_pid=server.pid)
        log.info("server_launched", pid=server.pid, pgid=server.pgid)
        self.record_run(server)
        return server

    def record_run(self, server: ServerProcess) -> None:
        start = self.proc.start_ticks(server.pid) or 0

        def change(state: RunState) -> RunState:
            return dataclasses.replace(
                state,
                instance=self.settings.instance,
                run_id=self.run_id,
                supervisor_pid=os.getpid(),
                restart_count=self.budget.total_restarts,
                server_pids=(ProcessRef(pid=server.pid, start_ticks=start, title="server"),),
                gpu_indices=self.plan.local_gpu_ids(),
            )

        self.store.update(change)

    def advance_startup(self, monitor: LaunchMonitor, new: ServerState) -> None:
        if self.state is ServerState.LAUNCHING and new is not ServerState.LOADING:
            self.set_state(ServerState.LOADING)
        if new is ServerState.WARMING and self.state is ServerState.WARMING:
            return
        self.set_state(new)
        monitor.mark_state(new)
        if new is ServerState.READY:
            self.notifier.ready(self._status_line())
            self.record_tree(monitor.server)

    def record_tree(self, server: ServerProcess) -> None:
        """Every PID of the ready tree, with start times: a later run finds leftovers by them."""
        refs = tuple(
            ProcessRef(pid=p.pid, start_ticks=ticks, title=p.title[:60])
            for p in server.tree()
            if (ticks := self.proc.start_ticks(p.pid)) is not None
        )
        self.store.update(lambda s: dataclasses.replace(s, server_pids=refs))

    def on_component_event(self, server: ServerProcess, event: Any) -> Death | None:
        kind = str(getattr(event, "kind", ""))
        reason = str(getattr(event, "reason", ""))
        log.warning("component_event", kind=kind, reason=reason)
        if kind == "memory_terminate":
            # The watchdog sent SIGTERM and escalates itself; the exit is then a memory kill.
            server.record_kill_reason(FailureKind.MEMORY_KILL.value, reason)
            return None
        if kind in FailureKind._value2member_map_:
            server.record_kill_reason(kind, reason)
            return Death(FailureKind(kind), reason)
        return None

    def handle_death(
        self,
        server: ServerProcess,
        monitor: LaunchMonitor,
        death: Death,
        argv: tuple[str, ...],
        oom_kills_at_launch: int | None,
    ) -> DeathReport:
        """Kill what is left of the tree, reap it, classify the death."""
        self.set_state(ServerState.UNHEALTHY, cause=death.observed or "exited", detail=death.detail)
        exited_first = server.poll()
        pids = server.kill_all(death.observed.value if death.observed else "exited", death.detail)
        self.wait_tree_gone(server)
        status = server.poll()
        reason = server.kill_reason
        override = None
        if reason is not None and reason.kind in (FailureKind.MEMORY_KILL, FailureKind.GPU_DIRTY):
            override = FailureKind(reason.kind)
        oom_now = self.proc.oom_kill_count()
        oom = (
            None
            if oom_now is None or oom_kills_at_launch is None
            else oom_now - oom_kills_at_launch
        )
        context = DeathContext(
            observed=death.observed,
            override=override,
            override_detail=reason.detail if override and reason else "",
            was_ready=monitor.ready_since_s is not None,
            killed_by_us=exited_first is None,
            oom_kills=oom,
        )
        status_code = status.exit_code if status else None
        status_sig = status.signal_number if status else None
        if exited_first is None:  # we killed a live tree: its SIGKILL says nothing
            status_code = status_sig = None
        result = classify(status_code, status_sig, server.tail(), context)
        log.error(
            "server_failed",
            failure=result.kind.value,
            hint=result.hint,
            exit_code=status_code,
            signal=status_sig,
            pids=list(pids),
        )
        report = DeathReport(
            run_id=self.run_id,
            classification=result,
            exit_status=exited_first,
            was_ready=context.was_ready,
            pids=tuple(pids),
            plan=self.plan,
            argv=argv,
            store=self.store,
        )
        for hook in self.death_hooks:
            hook(report)
        return report

    def decide_restart(self, death: DeathReport) -> float:
        """The delay before the next launch; raises when the run must end instead."""
        kind = death.classification.kind
        now_s = self.clock.monotonic()
        self.budget, decision = self.budget.on_failure(now_s)
        self.store.update(
            lambda s: dataclasses.replace(
                s,
                restart_count=self.budget.total_restarts,
                last_failure=kind.value,
                last_failure_hint=death.classification.hint,
                last_failure_at=self._wall(),
            )
        )
        if kind is FailureKind.BAD_FLAGS:
            self.set_state(ServerState.FATAL, failure=kind.value)
            raise ServerArgsRejected(death.classification.hint)
        if kind is FailureKind.GPU_DIRTY:
            self.set_state(ServerState.FATAL, failure=kind.value)
            raise GpuUnrecoverable(death.classification.hint)
        if kind is FailureKind.STARTUP_TIMEOUT:
            # A load that progressed for the whole hard limit would take as long again.
            self.set_state(ServerState.FATAL, failure=kind.value)
            raise StartupFailed(death.classification.hint)
        if decision.give_up:
            self.set_state(
                ServerState.FATAL,
                failure=kind.value,
                restarts_in_window=decision.restarts_in_window,
                event_name="crash_loop",
            )
            raise CrashLoop(
                f"crash loop: {decision.restarts_in_window} restarts within "
                f"{self.run_cfg.restart_window_s:g} s, last failure {kind.value}: "
                f"{death.classification.hint}"
            )
        self.set_state(
            ServerState.BACKOFF,
            failure=kind.value,
            delay_s=decision.delay_s,
            attempt=decision.attempt,
            restart_count=self.budget.total_restarts,
            event_name="restarting",
        )
        return decision.delay_s

    def backoff(self, delay_s: float) -> bool:
        """Wait `delay_s`; False when a stop signal arrived meanwhile."""
        try:
            self.wait_clock.sleep(delay_s)
        except StopRequested as stop:
            self.stopped_while_waiting(stop.event.name)
            return False
        finally:
            self.wait_clock.held.clear()  # component events of a dead server are stale
        return True

    def wait_gpus_released(self, old_pids: Sequence[int]) -> None:
        """Block until the old run's GPUs are free (cleanup.py); exit 6 when one stays dirty."""
        if self.sensor is None or not old_pids:
            return
        gpu = self.settings.config.gpu
        result = cleanup.wait_for_gpu_release(
            self.sensor,
            self.plan.local_gpu_ids(),
            old_pids,
            timeout_s=gpu.release_timeout_s,
            clock=self.wait_clock,
            baselines=self.baselines,
            tolerance_bytes=gpu.release_tolerance_bytes,
            resetter=self.resetter,
            d_state_grace_s=gpu.d_state_grace_s,
        )
        if not result.ok:
            self.store.update(
                lambda s: dataclasses.replace(
                    s, last_failure=FailureKind.GPU_DIRTY.value, last_failure_hint=result.reason
                )
            )
        cleanup.raise_if_unrecoverable(result, self._notify_status)

    def stopped_while_waiting(self, signal_name: str) -> None:
        """A stop signal during a wait with no server running: nothing to drain."""
        if self.state is ServerState.STOPPED:
            log.info("stopped", reason=signal_name)
            return
        self.set_state(ServerState.STOPPING, reason=signal_name)
        self.set_state(ServerState.STOPPED)

    def stop_server(self, server: ServerProcess) -> None:
        """SIGTERM the group, wait stop_grace (SGLang drains), SIGKILL everything, reap."""
        self.set_state(ServerState.STOPPING, reason=self.stop_reason)
        self.notifier.stopping(f"stopping (run {self.run_id})")
        server.record_kill_reason("stop")
        server.signal_group(signal.SIGTERM)
        deadline = self.clock.monotonic() + self.run_cfg.stop_grace_s
        while server.poll() is None and (left := deadline - self.clock.monotonic()) > 0:
            event = self.next_event(min(0.1, left))
            if isinstance(event, SignalEvent):
                log.warning("stop_escalated", signal=event.name)
                break
            self._feed_watchdog()
        pids = server.kill_all("stop")
        self.wait_tree_gone(server)
        self.set_state(ServerState.STOPPED, pids=list(pids))

    def wait_tree_gone(self, server: ServerProcess) -> None:
        deadline = self.clock.monotonic() + TREE_GONE_WAIT_S
        while True:
            left = [p.pid for p in server.remaining() if not p.is_zombie]
            if not left:
                server.pump.join(1.0)
                return
            if self.clock.monotonic() >= deadline:
                log.error("server_tree_not_gone", pids=left, waited_s=TREE_GONE_WAIT_S)
                return
            server.kill_all()
            self.clock.sleep(0.02)

    # -- helpers -------------------------------------------------------------------------

    def set_state(self, new: ServerState, *, event_name: str | None = None, **kv: Any) -> None:
        """The one place the state changes: check the table, log one event, tell systemd."""
        self.state = check_transition(self.state, new)
        level = "error" if new in (ServerState.UNHEALTHY, ServerState.FATAL) else "info"
        kv.setdefault("restart_count", self.budget.total_restarts)
        getattr(log, level)(event_name or new.value, **kv)
        self.notifier.status(self._status_line())

    def next_event(self, timeout_s: float) -> Event | None:
        try:
            return self.events.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None

    def _feed_watchdog(self) -> None:
        interval = self.notifier.watchdog_interval_s
        now = self.clock.monotonic()
        if interval is not None and now - self._last_ping_s >= interval:
            self.notifier.watchdog()
            self._last_ping_s = now

    def _notify_status(self, text: str) -> None:
        self.notifier.status(text)

    def _status_line(self) -> str:
        return f"{self.state.value}; restarts {self.budget.total_restarts}; run {self.run_id}"

    def _gpu_used(self) -> int:
        assert self.sensor is not None
        return gpu_used_on(self.sensor.read_gpus(), self.plan.local_gpu_ids())

    @staticmethod
    def _wall() -> float:
        return time.time()
