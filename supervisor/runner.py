"""`sglang-supervisor run`: the supervision loop.

    leftovers of an earlier run -> [GPU release] -> pre-flight gate -> launch -> readiness ->
    liveness -> (stop | death -> classify -> backoff -> [GPU release] -> relaunch)

Short named steps over the adapters; decisions come from supervisor/core. Signals and component
events (the memory watchdog) arrive on one queue.SimpleQueue; the loop is the only place that
changes the server's state (one event per change, run_id bound).
"""

from __future__ import annotations

import dataclasses
import queue
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from supervisor import cleanup, launch, leftovers
from supervisor.adapters.procfs import ProcReader
from supervisor.adapters.server_process import ServerProcess, become_subreaper
from supervisor.adapters.systemd import SdNotifier
from supervisor.core.backoff import BackoffPolicy, RestartBudget
from supervisor.core.lifecycle import HealthStatus, ServerState, check_transition
from supervisor.core.redact import Redactor, secret_values
from supervisor.core.sglang_args import LaunchPlan, parse_launch_args, redact_argv
from supervisor.death import (
    DeathHook,
    DeathReport,
    component_death,
    kill_and_classify,
    terminal_error,
    wait_tree_gone,
)
from supervisor.errors import (
    CrashLoop,
    ExitCode,
)
from supervisor.monitor import Death, LaunchMonitor, gpu_used_on
from supervisor.ports import Clock, GpuResetter, GpuSensor
from supervisor.run_events import (
    Component,
    ComponentFactory,
    Event,
    EventClock,
    LaunchInfo,
    SignalEvent,
    StopRequested,
    install_signal_handlers,
)
from supervisor.state import RunState, StateStore

log = structlog.get_logger("supervisor.run")

# The contract with the components and hooks (supervisor/protection.py plugs in through these).
__all__ = [
    "Component",
    "ComponentFactory",
    "DeathHook",
    "DeathReport",
    "LaunchInfo",
    "ReleaseHook",
    "Runner",
]

# Told the outcome of every GPU release wait (ok or not) before a failed one ends the run.
ReleaseHook = Callable[[cleanup.ReleaseResult], None]


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
        release_hooks: Sequence[ReleaseHook] = (),
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
        self.plan = parse_launch_args(settings.server_args)
        self.release = leftovers.GpuRelease(
            settings,
            self.plan.local_gpu_ids(),
            sensor=sensor,
            store=store,
            resetter=resetter,
            hooks=release_hooks,
            notify_status=self._notify_status,
        )
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
        started: list[Component] = []
        monitor: LaunchMonitor | None = None
        try:
            info = LaunchInfo(
                run_id=self.run_id,
                argv=argv,
                plan=parse_launch_args(argv),
                expected_total_bytes=self.expected_total_bytes,
                state_dir=str(self.settings.state_dir),
            )
            monitor = LaunchMonitor(
                server,
                run=self.run_cfg,
                expected_ranks=self.plan.local_ranks,
                probe=self.probe_factory(self.plan),
                clock=self.clock,
                gpu_used_bytes=self._gpu_used if self.sensor is not None else None,
            )
            oom_kills_at_launch = self.proc.oom_kill_count()
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
            wait_tree_gone(server, self.clock)
            raise
        finally:
            if monitor is not None:
                monitor.close()
            for component in started:
                component.stop()
            server.close()

    def watch(self, server: ServerProcess, monitor: LaunchMonitor) -> Death | None:
        """Tick until the server dies (its Death) or a stop signal arrives (None)."""
        wait_s = 0.0  # the first tick at once: "loading" is logged as soon as it is true
        while True:
            event = self.next_event(wait_s)
            wait_s = monitor.tick_s
            if isinstance(event, SignalEvent):
                self.stop_reason = event.name
                return None
            if event is not None:
                death = component_death(server, event)
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
        """Kill processes of an earlier run of this instance (and foreign GPU holders when
        allowed), waiting for their GPUs; then measure the GPUs' idle baseline."""
        leftovers.clean_leftovers(
            self.proc,
            state,
            self.settings,
            self.plan.local_gpu_ids(),
            sensor=self.sensor,
            clock=self.wait_clock,
            wait_released=self.wait_gpus_released,
        )
        self.release.measure_baselines()

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
        self.set_state(ServerState.LAUNCHING, argv=list(redact_argv(argv)))
        server = launch.start_server(
            self.settings, self.run_id, argv, redact=self.redact, proc=self.proc
        )
        self._launched_argv = argv
        structlog.contextvars.bind_contextvars(server_pid=server.pid)
        log.info("server_launched", pid=server.pid, pgid=server.pgid)
        try:
            launch.record_launch(
                self.store,
                self.settings,
                server,
                restart_count=self.budget.total_restarts,
                gpu_indices=self.plan.local_gpu_ids(),
            )
        except BaseException:
            # A full disk must not leave a tree running that nobody watches.
            server.kill_all("stop", "supervisor error")
            wait_tree_gone(server, self.clock)
            server.close()
            raise
        return server

    def advance_startup(self, monitor: LaunchMonitor, new: ServerState) -> None:
        if self.state is ServerState.LAUNCHING and new is not ServerState.LOADING:
            self.set_state(ServerState.LOADING)
        if new is ServerState.WARMING and self.state is ServerState.WARMING:
            return
        if new is ServerState.READY:
            # Recorded before `ready` is announced, so whoever reacts to it finds every PID.
            launch.record_tree(self.store, monitor.server)
        self.set_state(new)
        monitor.mark_state(new)
        if new is ServerState.READY:
            self.notifier.ready(self._status_line())

    def handle_death(
        self,
        server: ServerProcess,
        monitor: LaunchMonitor,
        death: Death,
        argv: tuple[str, ...],
        oom_kills_at_launch: int | None,
    ) -> DeathReport:
        """Kill what is left of the tree, reap it, classify the death, run the death hooks."""
        self.set_state(ServerState.UNHEALTHY, cause=death.observed or "exited", detail=death.detail)
        was_ready = monitor.ready_since_s is not None
        result, exit_status, pids = kill_and_classify(
            server,
            death,
            was_ready=was_ready,
            oom_kills_at_launch=oom_kills_at_launch,
            proc=self.proc,
            clock=self.clock,
        )
        report = DeathReport(
            run_id=self.run_id,
            classification=result,
            exit_status=exit_status,
            was_ready=was_ready,
            pids=pids,
            plan=self.plan,
            argv=argv,
            store=self.store,
        )
        for hook in self.death_hooks:
            hook(report)
        return report

    def decide_restart(self, death: DeathReport) -> float:
        """The delay before the next launch; raises when the run must end instead."""
        kind, hint = death.classification
        fatal = terminal_error(kind, hint)
        if fatal is None:
            self.budget, decision = self.budget.on_failure(self.clock.monotonic())
        self.store.update(
            lambda s: dataclasses.replace(
                s,
                restart_count=self.budget.total_restarts,
                last_failure=kind.value,
                last_failure_hint=hint,
                last_failure_at=time.time(),
            )
        )
        if fatal is not None:
            self.set_state(ServerState.FATAL, failure=kind.value)
            raise fatal
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
        self.release.wait(old_pids, self.wait_clock)

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
        wait_tree_gone(server, self.clock)
        self.set_state(ServerState.STOPPED, pids=list(pids))

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
