"""`sglang-supervisor run`: the supervision loop.

    leftovers of an earlier run -> [GPU release] -> pre-flight gate -> launch -> readiness ->
    liveness -> (stop | death -> classify -> restart or not -> backoff -> [GPU release] -> relaunch)

Short named steps over the ports (core/ports.py); decisions come from supervisor/core. Signals and
the memory watchdog's events arrive on one queue; the loop is the only place that changes the
server's state (one event per change, run_id bound).
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog

from supervisor.config import RunSettings
from supervisor.core.checks import FitReport
from supervisor.core.drain import DrainLog
from supervisor.core.events import (
    KillReason,
    MemoryAction,
    SignalEvent,
    Wake,
    WakeEvent,
    WatchdogEvent,
)
from supervisor.core.lifecycle import ServerState, check_transition
from supervisor.core.measured import SizingLog
from supervisor.core.ports import LaunchedServer
from supervisor.core.redact import Redactor
from supervisor.core.sglang_args import redact_argv
from supervisor.errors import SupervisorError
from supervisor.run import group_mode, launch, override, reload, restart
from supervisor.run.death import (
    Death,
    DeathReport,
    OomCounts,
    drain_then_kill,
    kill_and_classify,
    note_cut,
    oom_counts,
    wait_tree_gone,
)
from supervisor.run.events import (
    EventClock,
    StopRequested,
    extension_margin_s,
    watchdog_slice_s,
)
from supervisor.run.gpu_wait import GpuRelease
from supervisor.run.leftovers import clean_leftovers
from supervisor.run.monitor import LaunchMonitor, monitor_for
from supervisor.run.plugins import Component, LaunchInfo, Plugins, RunnerIO
from supervisor.run.restart import restore_budget
from supervisor.run.state import StateStore

log = structlog.get_logger("supervisor.run")


class Runner:
    def __init__(
        self,
        settings: RunSettings,
        store: StateStore,
        io: RunnerIO,
        plugins: Plugins | None = None,
    ) -> None:
        plugins = plugins or Plugins()
        self.settings = settings
        self.run_cfg = settings.run
        self.store = store
        self.io = io
        self.plugins = plugins
        self.clock = io.clock
        self.events = io.events
        self.notifier = io.notifier
        self.wait_clock = EventClock(
            io.clock,
            io.events,
            on_tick=self._feed_watchdog,
            on_signal=self.answer_signal,
            extend=self.notifier.extend_timeout,
            extend_margin_s=extension_margin_s(settings.config.gpu),
            max_slice_s=watchdog_slice_s(self.notifier.watchdog_interval_s),
        )
        self.plan = settings.reader.plan(settings.server_args)
        self.contained_leftovers: tuple[int, ...] = ()  # the containment's kills: GPUs awaited
        self.release = GpuRelease(
            settings.config.gpu,
            self.plan.local_gpu_ids(),
            instance=settings.instance,
            sensor=io.sensor,
            processes=io.processes,
            store=store,
            resetter=io.resetter,
            hooks=plugins.release_hooks,
            notify_status=self.notifier.status,
        )
        self.stop_reason = "signal"
        self.fit: FitReport | None = None
        self.run_id = ""
        self.state = ServerState.STOPPED
        self.budget = restore_budget(store.load(), self.run_cfg.backoff_policy(), io.clock)
        # Every secret `run` knows: the server's, the inherited environment's (systemd's
        # Environment=), the operator's commands' and the group token.
        self.redact = Redactor(reload.secrets_of(settings))
        self._last_ping_s = self._last_reap_s = self._last_pin_s = float("-inf")
        self.launched_argv: tuple[str, ...] | None = None

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped (0) or a failure that ends the run (raises SupervisorError)."""
        try:
            self.clean_leftovers()
            group_mode.before_first_launch(self)  # group mode: the leader's address resolves
            self.wait_clock.poll()  # a stop that came during start-up: no launch at all
            while True:
                death = self.supervise_once()
                if death is None and not reload.relaunch_after_reload(self):
                    return 0
                if death is None:
                    continue
                delay_s = restart.after_death(self, death)  # group mode: exit 8 instead
                if not restart.backoff(self, delay_s):
                    return 0
                self.plugins.before_relaunch(self.release, death.pids, self.wait_clock)
                self.release.wait(death.pids, self.wait_clock)
        except StopRequested as stop:
            self.stopped_while_waiting(stop.event.name)
            return 0
        except SupervisorError as exc:  # every fatal end leaves one `fatal` event with its reason
            reason, *rest = str(exc).splitlines() or [""]
            extra = {"detail": "\n".join(rest)} if rest and not exc.detail_logged else {}
            self.set_state(ServerState.FATAL, exit_code=int(exc.exit_code), reason=reason, **extra)
            exc.logged = True
            raise
        finally:
            if self.io.reservations is not None:
                self.io.reservations.drop()
            structlog.contextvars.unbind_contextvars("run_id", "server_pid")

    def supervise_once(self) -> DeathReport | None:
        """One launch, watched until it dies (the report) or a stop signal (None)."""
        argv = self.prepare_argv()
        server = self.launch(argv)
        started: list[Component] = []
        monitor: LaunchMonitor | None = None
        try:
            info = LaunchInfo(
                run_id=self.run_id, argv=argv, plan=self.settings.reader.plan(argv), fit=self.fit
            )
            monitor = monitor_for(server, self.io, lambda: self.run_cfg, self.plan)
            oom_at_launch = oom_counts(server, self.io.processes)
            for factory in self.plugins.components:
                if (component := factory(server, self.events.put, info)) is not None:
                    started.append(component)
                    component.start()
            death = self.watch(server, monitor)
            if death is None:
                self.stop_server(server)
                return None
            return self.handle_death(server, monitor, death, argv, oom_at_launch)
        except BaseException:
            # A bug or an interrupt must not leave the tree running (PDEATHSIG would take the
            # server only once this process is gone, and not its escapees).
            reason = KillReason(None, "supervisor error")
            server.kill_all(reason)
            wait_tree_gone(server, self.clock, reason)
            raise
        finally:
            if monitor is not None:
                monitor.close()
            for component in started:
                component.stop()
            server.close()
            if self.state is not ServerState.STOPPED:  # a stop swept before it said `stopped`
                self.io.sweep_shm(server.members_seen())  # after a SIGKILL, SGLang's are left

    def watch(self, server: LaunchedServer, monitor: LaunchMonitor) -> Death | None:
        """Tick until the server dies (its Death) or a stop signal arrives (None)."""
        wait_s = 0.0  # the first tick at once: "loading" is logged as soon as it is true
        while True:
            event = self.events.get(wait_s)
            wait_s = monitor.tick_s
            if isinstance(event, SignalEvent):
                if not event.stops and not self.answer_signal(event):
                    continue
                self.stop_reason = event.name if event.stops else reload.RELOAD_STOP
                return None
            if isinstance(event, WatchdogEvent):
                log.warning("component_event", action=event.action.value, reason=event.reason)
                if event.action is MemoryAction.KILLED:
                    return Death(event.failure, event.reason)
                continue  # TERMINATED: the watchdog escalates itself; the exit follows
            result = monitor.tick()
            self._feed_watchdog()
            if result.death is not None:
                return result.death
            if result.new_state is not None and result.new_state is not self.state:
                self.advance_startup(monitor, result.new_state)
            if result.progressed_s_left is not None:
                self.notifier.extend_timeout(result.progressed_s_left + 30.0)
            if result.pinned_bytes is not None:
                self._note_pinned(result.pinned_bytes)
            if monitor.ready_since_s is not None:
                self.budget = self.budget.on_healthy(monitor.ready_since_s, self.clock.monotonic())

    def clean_leftovers(self) -> None:
        """Kill processes of an earlier run of this instance (and foreign GPU holders when
        allowed), waiting for their GPUs, and the shared memory they left; then measure the
        GPUs' idle baseline."""
        earlier = self.store.load()
        clean_leftovers(
            self.io.processes,
            earlier,
            self.settings,
            self.plan.local_gpu_ids(),
            sensor=self.io.sensor,
            clock=self.wait_clock,
            wait_released=lambda pids: self.release.wait(pids, self.wait_clock),
            killed=self.contained_leftovers,
        )
        self.io.sweep_shm({p.pid: p.start_ticks for p in earlier.server_pids})
        self.release.measure_baselines(self.wait_clock, force=self.run_cfg.force)

    def prepare_argv(self) -> tuple[str, ...]:
        """The argv of this launch: the watchdog's override, then the pre-flight gate (first
        launch, and whenever the argv changed). Its report travels with the launch."""
        argv = override.launch_override(self.settings, self.store, self.clock.wall())
        book = self.io.reservations
        if self.launched_argv is None or argv != self.launched_argv:  # and the group's decision
            argv, self.fit = group_mode.preflight_gate(self, argv, book)
        else:  # the same argv again: the GPUs' health gate, the ledger's plan
            launch.relaunch_gate(self.settings, self.plan, self.io.sensor, self.fit, book)
        return argv

    def launch(self, argv: tuple[str, ...]) -> LaunchedServer:
        self.run_id = uuid.uuid4().hex[:12]
        self.sizing = SizingLog()  # SGLang's own numbers of this launch, from its output
        self.drain_log = DrainLog()
        structlog.contextvars.bind_contextvars(run_id=self.run_id)
        self.set_state(ServerState.LAUNCHING, argv=list(redact_argv(argv)))
        processes = self.io.processes
        server = launch.start_server(
            self.io.launcher,
            self.settings,
            self.run_id,
            argv,
            redact=self.redact,
            supervisor_mark=processes.self_mark(),
            on_line=self._server_line,
        )
        self.launched_argv = argv
        server.watch_exits(lambda: self.events.put(WakeEvent(Wake.TREE_CHANGED)))
        structlog.contextvars.bind_contextvars(server_pid=server.pid)
        log.info("server_launched", pid=server.pid, pgid=server.pgid, mode=server.mode)
        launch.record_launch(
            self.store,
            self.settings,
            server,
            processes=processes,
            clock=self.clock,
            restart_count=self.budget.total_restarts,
            gpu_indices=self.plan.local_gpu_ids(),
        )
        return server

    def advance_startup(self, monitor: LaunchMonitor, new: ServerState) -> None:
        if self.state is ServerState.LAUNCHING and new is not ServerState.LOADING:
            self.set_state(ServerState.LOADING)
        monitor.mark_state(new)  # at ready: every member read once more
        if new is ServerState.READY:
            # Recorded before `ready` is announced, so whoever reacts to it finds every PID.
            launch.record_tree(self.store, monitor.server)
            measured, at = self.sizing.measurement(), self.clock.wall()
            launch.record_measurement(self.settings, self.fit, self.launched_argv, measured, at)
            if self.io.reservations is not None:
                self.io.reservations.drop()  # all pinned: MemAvailable shows it from now on
        self.set_state(new)
        if new is ServerState.READY:
            self.notifier.ready(self._status_line())

    def handle_death(
        self,
        server: LaunchedServer,
        monitor: LaunchMonitor,
        death: Death,
        argv: tuple[str, ...],
        oom_at_launch: OomCounts,
    ) -> DeathReport:
        """Kill what is left of the tree, reap it, classify the death, run the death hooks."""
        self.set_state(ServerState.UNHEALTHY, cause=death.observed or "exited", detail=death.detail)
        was_ready = monitor.ready_since_s is not None
        result, exit_status, pids = kill_and_classify(
            server,
            death,
            was_ready=was_ready,
            oom_at_launch=oom_at_launch,
            processes=self.io.processes,
            clock=self.clock,
        )
        report = DeathReport(
            run_id=self.run_id,
            classification=result,
            exit_status=exit_status,
            was_ready=was_ready,
            pids=pids,
            argv=argv,
            plan=self.settings.reader.plan(argv),
            fit=self.fit,
        )
        for hook in self.plugins.death_hooks:
            hook(report)
        return report

    def stopped_while_waiting(self, signal_name: str) -> None:
        """A stop signal during a wait with no server running: nothing to drain."""
        if self.state is ServerState.STOPPED:
            log.info("stopped", reason=signal_name)
            return
        self.set_state(ServerState.STOPPING, reason=signal_name)
        self.set_state(ServerState.STOPPED)

    def stop_server(self, server: LaunchedServer) -> None:
        """SIGTERM the main process, wait for it to drain and exit, SIGKILL everything, reap.

        The grace is stop_grace on node 0 and worker_stop_grace on nodes with --node-rank >= 1,
        whose main process does not drain but waits for rank 0's shutdown broadcast.
        """
        worker = self.plan.node_rank >= 1
        grace_s = self.run_cfg.worker_stop_grace_s if worker else self.run_cfg.stop_grace_s
        self.set_state(ServerState.STOPPING, reason=self.stop_reason, grace_s=grace_s)
        if self.stop_reason != reload.RELOAD_STOP:  # a reload's relaunch: the unit stays up
            self.notifier.stopping(f"stopping (run {self.run_id})")
        drained = drain_then_kill(
            server, grace_s, self.clock, self.events, self._feed_watchdog, self.drain_log.since
        )
        self.stopped_pids = drained.pids
        self.io.sweep_shm(server.members_seen())  # before `stopped`: the run's last word
        if drained.cut == "grace" and not worker:  # a worker has no requests of its own
            note_cut(drained, grace_s)
        drained_s = round(drained.drained_s, 3)
        # On its own line a cut drain must not read as a clean one (drain_cut has the count).
        drain = "exited" if drained.cut is None else f"cut_by_{drained.cut}"
        self.set_state(
            ServerState.STOPPED, pids=list(drained.pids), drained_s=drained_s, drain=drain
        )

    # -- helpers -------------------------------------------------------------------------

    def set_state(self, new: ServerState, *, event_name: str | None = None, **kv: Any) -> None:
        """The one place the state changes: check the table, log one event, tell systemd."""
        self.state = check_transition(self.state, new)
        level = "error" if new in (ServerState.UNHEALTHY, ServerState.FATAL) else "info"
        kv.setdefault("restart_count", self.budget.total_restarts)
        getattr(log, level)(event_name or new.value, **kv)
        self.notifier.status(self._status_line())

    def _feed_watchdog(self) -> None:
        """Every tick, in the loop and in its waits: systemd's watchdog, and the orphans a
        container's PID 1 must reap (at most once a second).

        WATCHDOG=1 goes out once half the notifier's interval (a quarter of WatchdogSec) has
        passed since the last, and the waits tick at least that often (watchdog_slice_s): a
        tick late by up to another quarter still keeps every gap within half of WatchdogSec,
        as sd_watchdog_enabled(3) asks, GPU resets included (they run off the loop)."""
        interval = self.notifier.watchdog_interval_s
        now = self.clock.monotonic()
        if now - self._last_reap_s >= 1.0:
            self.io.processes.reap_orphans()
            self._last_reap_s = now
        if interval is not None and now - self._last_ping_s >= interval / 2:
            self.notifier.watchdog()
            self._last_ping_s = now

    def _server_line(self, line: str) -> None:
        """Each line of the server's output (its output thread): SGLang's own numbers."""
        self.sizing.feed(line)
        self.drain_log.feed(line, self.clock.monotonic())

    def _note_pinned(self, pinned_bytes: int) -> None:
        """While starting, the ledger learns how much of the plan the tree holds (once a second);
        not after ready, whose tick dropped the entry (a set would bring it back for good)."""
        now = self.clock.monotonic()
        book = self.io.reservations
        starting = self.state in (ServerState.LAUNCHING, ServerState.LOADING, ServerState.WARMING)
        if book is None or self.fit is None or not starting or now - self._last_pin_s < 1.0:
            return
        self._last_pin_s = now
        book.set(self.fit.host_required_bytes or 0, pinned_bytes)

    def answer_signal(self, event: SignalEvent) -> bool:
        """SIGUSR1 and SIGHUP (run/reload.py); True: relaunch the server for a new config."""
        return reload.answer_signal(self, event)

    def _status_line(self) -> str:
        return f"{self.state.value}; restarts {self.budget.total_restarts}; run {self.run_id}"
