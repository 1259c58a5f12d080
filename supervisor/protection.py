"""Plugs the memory watchdog and restart-smaller into the runner, and follows each incident.

`Protection(settings, sensor=...)` gives what `Runner(...)` takes: `components` (one
MemoryWatchdog per launched server, budgeted from the pre-flight's expected total),
`death_hooks` (after a memory kill: next --hicache-size = size × shrink_factor, stored in the
state file), `resetter` (the configured GPU reset command) and `record_release` for the GPU
release outcome. The watchdog writes the incident; later steps are appended to it here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from supervisor.adapters.gpu_reset import CommandGpuResetter
from supervisor.adapters.server_process import ServerProcess
from supervisor.cleanup import ReleaseResult
from supervisor.config import SupervisorConfig, WatchdogConfig
from supervisor.core.classify import FailureKind
from supervisor.core.policy import Level, Limits, tree_kill_line
from supervisor.core.readings import ProcessInfo
from supervisor.core.sglang_args import ArgvError, parse_launch_args
from supervisor.core.shrink import decide_shrink
from supervisor.core.units import GB
from supervisor.errors import ConfigError, SupervisorError
from supervisor.incident import Incident
from supervisor.launch import RunSettings
from supervisor.ports import GpuSensor
from supervisor.runner import ComponentFactory, DeathHook, DeathReport, LaunchInfo
from supervisor.state import RunState
from supervisor.watchdog import HostSource, MemoryWatchdog

log = structlog.get_logger("supervisor.protection")


def limits_from_config(cfg: WatchdogConfig, expected_total_bytes: int | None) -> Limits:
    """core.policy.Limits from [watchdog]; the tree budget from the pre-flight's expected total."""

    def level(bytes_: int, percent: float) -> Level:
        return Level(bytes_=bytes_ or None, percent=percent or None)

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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    """What the pre-flight expects of a launched argv (None: it could not say)."""

    total_bytes: int | None
    pool_bytes_per_rank: int | None


def expect(config: SupervisorConfig, argv: Sequence[str], config_dir: Path | None) -> Expectation:
    """The pre-flight's expected host total and pool per rank for `argv` (never raises)."""
    from supervisor.preflight import run_preflight  # model geometry: loaded once per launch

    try:
        report = run_preflight(config, argv, config_dir=config_dir)
    except (SupervisorError, OSError, ValueError) as exc:
        log.warning("watchdog_budget_unknown", reason=str(exc))
        return Expectation(total_bytes=None, pool_bytes_per_rank=None)
    return Expectation(
        total_bytes=report.host_required_bytes, pool_bytes_per_rank=report.host_pool_bytes_per_rank
    )


class Protection:
    """The runner's hooks for one `run`; holds the incident of the latest memory event."""

    def __init__(
        self,
        settings: RunSettings,
        *,
        sensor: GpuSensor | None,
        read_host: HostSource | None = None,
        tree_view: Callable[[tuple[ProcessInfo, ...]], tuple[ProcessInfo, ...]] | None = None,
        expected_total_bytes: Callable[[Sequence[str]], Expectation] | None = None,
    ) -> None:
        self.settings = settings
        self.config = settings.config
        self.sensor = sensor
        self.read_host = read_host
        self.tree_view = tree_view
        self._expect = expected_total_bytes or (
            lambda argv: expect(self.config, argv, settings.config_dir)
        )
        self.dog: MemoryWatchdog | None = None
        self.incident: Incident | None = None
        self.expectation = Expectation(total_bytes=None, pool_bytes_per_rank=None)
        gpu = self.config.gpu
        self.resetter = (
            CommandGpuResetter(gpu.reset_command, timeout_s=gpu.reset_timeout_s)
            if gpu.reset_command
            else None
        )

    # -- component factory -----------------------------------------------------------------

    def watchdog_for(
        self, server: ServerProcess, post: Callable[[Any], None], info: LaunchInfo
    ) -> MemoryWatchdog | None:
        """Component factory: one watchdog per launched server, budgeted from the pre-flight."""
        if self.incident is not None:
            self.incident.record_next("relaunched", server_pid=server.pid, run_id=info.run_id)
            self.incident = None
        if not self.config.watchdog.enabled:
            return None
        total = info.expected_total_bytes
        pool = None
        if total is None or (info.plan.uses_hicache and info.plan.hicache_mode != "size"):
            expectation = self._expect(info.argv)
            total = total if total is not None else expectation.total_bytes
            pool = expectation.pool_bytes_per_rank
        self.expectation = Expectation(total_bytes=total, pool_bytes_per_rank=pool)
        limits = limits_from_config(self.config.watchdog, total)
        log.info(
            "watchdog_limits",
            tree_budget_bytes=limits.tree_budget_bytes,
            tree_kill_bytes=limits.tree_kill_bytes,
            kill_available=dataclasses.asdict(limits.kill),
        )
        snapshot = getattr(self.sensor, "last_snapshot", None)
        self.dog = MemoryWatchdog(
            server,
            limits,
            post=post,
            read_host=self.read_host,
            tree_view=self.tree_view,
            gpu_snapshot=snapshot,
            state_dir=self.settings.state_dir,
            run_id=info.run_id,
        )
        return self.dog

    # -- death hook: restart smaller ------------------------------------------------------------

    def on_death(self, report: DeathReport) -> None:
        if self.dog is not None and self.dog.incident is not None:
            self.incident = self.dog.incident
            self.incident.record_next(
                "classified", failure=report.classification.kind.value, pids=list(report.pids)
            )
        if report.classification.kind is not FailureKind.MEMORY_KILL:
            return
        try:
            launched = parse_launch_args(report.argv)
        except ArgvError:
            return
        cfg = self.config.watchdog
        decision = decide_shrink(
            launched,
            pool_bytes_per_rank=self.expectation.pool_bytes_per_rank,
            shrink_factor=cfg.shrink_factor,
            min_size_gb=max(1, cfg.min_hicache_size_bytes // GB),
        )
        if decision.size_gb is None:
            log.warning("hicache_not_shrunk", reason=decision.reason)
            return
        size = decision.size_gb

        def change(state: RunState) -> RunState:
            return dataclasses.replace(
                state, hicache_size_override_gb=size, override_reason=decision.reason
            )

        report.store.update(change)
        log.warning(
            "hicache_shrunk",
            previous_gb=decision.previous_gb,
            hicache_size_gb=size,
            reason=decision.reason,
            at_minimum=decision.at_minimum,
        )
        if self.incident is not None:
            self.incident.record_next(
                "restart_smaller", previous_gb=decision.previous_gb, hicache_size_gb=size
            )

    def record_release(self, result: ReleaseResult) -> None:
        """Append the GPU release outcome to the current incident (a failed one gets its own)."""
        if self.incident is not None:
            self.incident.record_next("gpu_release", **result.as_dict())
        if not result.ok:
            incident = Incident.create(
                self.settings.state_dir,
                "gpu_unrecoverable",
                result.reason,
                {"gpu_release": result.as_dict(), "pid": os.getpid()},
            )
            if incident is not None and self.incident is not None:
                self.incident.record_next("gpu_unrecoverable", incident=str(incident.path))

    # -- what Runner takes ----------------------------------------------------------------------

    @property
    def components(self) -> tuple[ComponentFactory, ...]:
        return (self.watchdog_for,)

    @property
    def death_hooks(self) -> tuple[DeathHook, ...]:
        return (self.on_death,)


def check_protection_config(config: SupervisorConfig) -> None:
    """Faults found before anything starts (exit 2): a reset command that cannot run.

    Raises:
        ConfigError: gpu.reset_command names a program that is missing or not executable.
    """
    from supervisor.adapters.gpu_reset import check_reset_command

    problem = check_reset_command(config.gpu.reset_command)
    if problem is not None:
        raise ConfigError(problem)
