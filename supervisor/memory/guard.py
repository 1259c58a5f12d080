"""Plugs the memory watchdog into the run loop and follows each incident to its end.

`MemoryGuard(settings, store, ...)` gives what the runner's Plugins take: a component factory
(one MemoryWatchdog per launched server, its tree budget from that launch's pre-flight report),
a death hook (restart smaller after a memory kill: the watchdog has written the size before its
kill already, the classification confirms it) and a release hook (the GPU release outcome
goes into the incident; a failed one gets an incident of its own). The watchdog writes the
incident; later steps are appended here.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import structlog

from supervisor.config import RunSettings, WatchdogConfig
from supervisor.core.events import Event
from supervisor.core.policy import Level, Limits, tree_kill_line
from supervisor.core.ports import ServerHandle
from supervisor.core.readings import GpuState, ProcessInfo
from supervisor.core.units import GB
from supervisor.memory.incident import Incident
from supervisor.memory.restart_smaller import ShrinkKeeper, restart_smaller
from supervisor.memory.watchdog import HostSource, MemoryWatchdog
from supervisor.run.death import DeathReport
from supervisor.run.gpu_wait import ReleaseResult
from supervisor.run.plugins import LaunchInfo, Plugins
from supervisor.run.state import StateStore

log = structlog.get_logger("supervisor.memory")

Snapshot = Callable[[], tuple[float, tuple[GpuState, ...] | None] | None]


def limits_from_config(cfg: WatchdogConfig, expected_total_bytes: int | None) -> Limits:
    """core.policy.Limits from [watchdog]; the tree budget from the pre-flight's expected total."""

    def level(size_bytes: int, percent: float) -> Level:
        return Level(bytes_=size_bytes or None, percent=percent or None)

    budget = kill = None
    if expected_total_bytes is not None and expected_total_bytes > 0:
        budget = expected_total_bytes
        kill = tree_kill_line(budget, cfg.tree_margin_percent, cfg.tree_margin_bytes)
    return Limits(
        warn=level(cfg.warn_bytes, cfg.warn_percent),
        terminate=level(cfg.terminate_bytes, cfg.terminate_percent),
        kill=level(cfg.kill_bytes, cfg.kill_percent),
        tree_budget_bytes=budget,
        tree_kill_bytes=kill,
        psi_full_warn_percent=cfg.psi_full_warn_percent or None,
        warn_ticks=cfg.warn_ticks,
        terminate_grace_s=cfg.terminate_grace_s,
        worst_ramp_bytes_per_s=cfg.ramp_gb_per_second * GB,
        min_interval_s=cfg.min_interval_s,
        max_interval_s=cfg.max_interval_s,
    )


class MemoryGuard:
    """The watchdog's side of one `run`; holds the incident of the latest memory event."""

    def __init__(
        self,
        settings: RunSettings,
        store: StateStore,
        *,
        gpu_snapshot: Snapshot | None = None,
        read_host: HostSource | None = None,
        tree_view: Callable[[tuple[ProcessInfo, ...]], tuple[ProcessInfo, ...]] | None = None,
    ) -> None:
        self.settings = settings
        self.cfg = settings.config.watchdog
        self.store = store
        self.gpu_snapshot = gpu_snapshot
        self.read_host = read_host
        self.tree_view = tree_view
        self.dog: MemoryWatchdog | None = None
        self.incident: Incident | None = None

    @property
    def plugins(self) -> Plugins:
        return Plugins(
            components=(self.watchdog_for,),
            death_hooks=(self.on_death,),
            release_hooks=(self.record_release,),
            reload_hooks=(self.on_reload,),
        )

    def watchdog_for(
        self, server: ServerHandle, post: Callable[[Event], None], info: LaunchInfo
    ) -> MemoryWatchdog | None:
        """Component factory: one watchdog per launched server, budgeted from its pre-flight."""
        if self.incident is not None:
            self.incident.record_next("relaunched", server_pid=server.pid, run_id=info.run_id)
            self.incident = None
        if not self.cfg.enabled:
            return None
        limits = limits_from_config(
            self.cfg, info.fit.host_required_bytes if info.fit is not None else None
        )
        log.info(
            "watchdog_limits",
            tree_budget_bytes=limits.tree_budget_bytes,
            tree_kill_bytes=limits.tree_kill_bytes,
            kill_available_bytes=limits.kill.bytes_,
            kill_available_percent=limits.kill.percent,
        )
        self.dog = MemoryWatchdog(
            server,
            limits,
            post=post,
            read_host=self.read_host,
            tree_view=self.tree_view,
            gpu_snapshot=self.gpu_snapshot,
            state_dir=self.settings.state_dir,
            run_id=info.run_id,
            incident_log_lines=self.cfg.incident_log_lines,
            keep_files=self.settings.run.keep_files,
            keep_shrink=ShrinkKeeper(info.plan, info.fit, lambda: self.cfg, self.store),
        )
        return self.dog

    def on_reload(self, settings: RunSettings) -> None:
        """A reload (SIGHUP): the new levels apply to the running watchdog at once (its tree
        budget stays that of its launch); the rest of [watchdog] from the next launch on."""
        self.settings, self.cfg = settings, settings.config.watchdog
        dog = self.dog
        if dog is None or not dog.is_running:
            return
        limits = limits_from_config(self.cfg, dog.limits.tree_budget_bytes)
        if limits != dog.limits:
            dog.limits = limits  # one reference swap: the thread reads it at its next tick
            levels = {"warn": limits.warn, "terminate": limits.terminate, "kill": limits.kill}
            log.info(
                "watchdog_limits_reloaded",
                **{f"{name}_available_bytes": level.bytes_ for name, level in levels.items()},
                **{f"{name}_available_percent": level.percent for name, level in levels.items()},
                tree_kill_bytes=limits.tree_kill_bytes,
            )

    def on_death(self, report: DeathReport) -> None:
        """Death hook: note the classification in the incident, then restart smaller."""
        if self.dog is not None:
            self.dog.wait_reported()
        if self.dog is not None and self.dog.incident is not None:
            self.incident = self.dog.incident
            self.incident.record_next(
                "classified", failure=report.classification.kind.value, pids=list(report.pids)
            )
        decision = restart_smaller(report, self.cfg, self.store)
        if decision is not None and decision.size_gb is not None and self.incident is not None:
            self.incident.record_next(
                "restart_smaller",
                previous_gb=decision.previous_gb,
                hicache_size_gb=decision.size_gb,
            )

    def record_release(self, result: ReleaseResult) -> None:
        """Append the GPU release outcome to the current incident (a failed one gets its own)."""
        if self.incident is not None:
            self.incident.record_next("gpu_release", **result.as_dict())
        if result.ok:
            return
        incident = Incident.create(
            self.settings.state_dir,
            "gpu_unrecoverable",
            result.reason,
            {"gpu_release": result.as_dict(), "pid": os.getpid()},
            keep=self.settings.run.keep_files,
        )
        if incident is not None and self.incident is not None:
            self.incident.record_next("gpu_unrecoverable", incident=str(incident.path))
