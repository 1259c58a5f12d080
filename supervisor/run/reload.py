"""The signals that leave the server running: SIGUSR1 logs the status, SIGHUP reloads the config.

A reload reads the config file again through the same command line and environment options
(RunnerIO.reload_settings) and compares it with the settings in force (core/reload.py says when
each changed key takes effect):

- a new config that is invalid is refused (`reload_refused`, the reason) and the old one stays;
- what is read at each use is put in force at once: the runner's settings and restart budget,
  the monitor (it reads them every tick), the health probe (live_probes), the memory
  watchdog's levels and the hooks (through Plugins.reload_hooks), the log level;
- what is read at a launch (the server's argv and environment, the pre-flight's facts) waits for
  the next restart of the server (`reload_pending`), or with `[run] restart_on_reload` the
  server is drained and relaunched now (refused in group mode: a relaunch in place breaks the
  group);
- what is set up once at start (state directory, cgroup, GPU access, log format, ...) keeps its
  old value until the supervisor itself restarts (`reload_pending`, `at_next_start`).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from supervisor.config import RunConfig, RunSettings
from supervisor.config.loader import toml_key
from supervisor.core.events import SignalAction, SignalEvent
from supervisor.core.lifecycle import HealthStatus
from supervisor.core.redact import Redactor, secret_values
from supervisor.core.reload import ReloadPlan, plan_reload
from supervisor.core.sglang_args import LaunchPlan
from supervisor.errors import ConfigError, SupervisorError
from supervisor.group.setup import group_secrets
from supervisor.log import configure_logging, configured_format, register_secrets

if TYPE_CHECKING:
    from supervisor.run.runner import Runner

log = structlog.get_logger("supervisor.run")

RELOAD_STOP = "reload"  # the runner's stop reason while a reload drains and relaunches the server


def answer_signal(runner: Runner, event: SignalEvent) -> bool:
    """SIGUSR1: one `status` event. SIGHUP: reload. True: drain and relaunch the server now."""
    if event.action is SignalAction.STATUS:
        restarts = runner.budget.total_restarts
        log.info("status", state=runner.state.value, restart_count=restarts, run_id=runner.run_id)
        return False
    return reload_config(runner)


def relaunch_after_reload(runner: Runner) -> bool:
    """After a stop: True when it was a reload's (the GPUs released, the loop relaunches)."""
    if runner.stop_reason != RELOAD_STOP:
        return False
    runner.stop_reason = "signal"
    runner.wait_clock.poll()  # a stop that cut the drain short ends the run here
    runner.release.wait(runner.stopped_pids, runner.wait_clock)
    return True


def reload_config(runner: Runner) -> bool:
    """Read the config again and put it in force; True when the server must be relaunched now.

    Never raises: a reload must not take a serving server down, whatever the new file holds.
    """
    source = runner.io.reload_settings
    if source is None:
        log.warning("reload_refused", reason="started without --config: no file to read again")
        return False
    try:
        new = source()
        _check_same_gpus(runner, new)
        plan = plan_reload(
            config_view(runner.settings),
            config_view(new),
            restart_on_reload=new.run.restart_on_reload,
        )
        effective = keep_until_start(new, runner.settings, plan.next_start)
        if plan.restart_server and runner.settings.group is not None:
            raise ConfigError(
                "group mode: this change needs a relaunch of the server, and a relaunch in "
                "place breaks the group (its other nodes hold the old communicator): restart "
                "the group to apply it"
            )
    except SupervisorError as exc:
        log.error("reload_refused", reason=str(exc), action="the config in force stays")
        return False
    except Exception:  # a bug here must not end a run that is serving (logged with traceback)
        log.exception("reload_refused", reason="internal error", action="the config in force stays")
        return False
    put_in_force(runner, effective, plan)
    _report(plan)
    return plan.restart_server


def config_view(settings: RunSettings) -> dict[str, Any]:
    """Every setting as `section.key` (TOML spelling) -> value; the server's argv and command
    as they are launched (the command line's, else the file's)."""
    view: dict[str, Any] = {}
    for section in dataclasses.fields(settings.config):
        table = getattr(settings.config, section.name)
        for field in dataclasses.fields(table):
            view[f"{section.name}.{toml_key(field.name)}"] = getattr(table, field.name)
    view["server.args"] = settings.server_args
    view["server.command"] = settings.server_command
    return view


def keep_until_start(new: RunSettings, old: RunSettings, keys: tuple[str, ...]) -> RunSettings:
    """`new` with the old value of every key that is set up once at start (and the old state
    directory, always).

    Raises:
        ConfigError: the mix is invalid (a new key contradicts a kept one).
    """
    sections: dict[str, dict[str, Any]] = {}
    for key in keys:
        section, name = key.split(".", 1)
        old_table = getattr(old.config, section)
        field = next(f.name for f in dataclasses.fields(old_table) if toml_key(f.name) == name)
        sections.setdefault(section, {})[field] = getattr(old_table, field)
    replaced = {
        section: dataclasses.replace(getattr(new.config, section), **fields)
        for section, fields in sections.items()
    }
    config = dataclasses.replace(new.config, **replaced)
    return dataclasses.replace(new, config=config, state_dir=old.state_dir)


def put_in_force(runner: Runner, new: RunSettings, plan: ReloadPlan) -> None:
    """Hand `new` to every part that reads it; the next launch reads the rest from the runner."""
    old = runner.settings
    runner.settings, runner.run_cfg = new, new.run
    runner.budget = dataclasses.replace(runner.budget, policy=new.run.backoff_policy())
    if plan.next_launch:
        runner.plan = new.reader.plan(new.server_args)
        # The old server may still print the old secrets: both stay masked.
        values = (*secrets_of(old), *secrets_of(new))
        runner.redact = Redactor(values)
        register_secrets(values)
        runner.launched_argv = None  # the pre-flight runs again before the next launch
    if "run.log_level" in plan.now:
        fmt = configured_format() or new.run.log_format
        configure_logging(fmt, new.run.log_level, server_output=new.config.log.server_output)
    for hook in runner.plugins.reload_hooks:
        hook(new)


def secrets_of(settings: RunSettings) -> tuple[str, ...]:
    """Every secret of these settings: the server's (argv, environment), those in the operator's
    commands (the GPU reset command, the hooks) and the group token."""
    plan = settings.reader.plan(settings.server_args)
    env = {**os.environ, **settings.config.server.env}
    commands = [*settings.config.hooks.commands().values()]
    if settings.config.gpu.reset_command:
        commands.append(tuple(shlex.split(settings.config.gpu.reset_command)))
    return (
        *secret_values(plan, env, commands),
        *group_secrets(settings.config, settings.group),
    )


def _check_same_gpus(runner: Runner, new: RunSettings) -> None:
    """The GPUs the server runs on are waited for and measured at start: a change needs a new
    supervisor (ConfigError)."""
    old_plan, new_plan = runner.plan, new.reader.plan(new.server_args)
    before, after = old_plan.local_gpu_ids(), new_plan.local_gpu_ids()
    if before != after or old_plan.node_rank != new_plan.node_rank:
        raise ConfigError(
            f"the new server argv runs on GPUs {list(after)} (node rank {new_plan.node_rank}), "
            f"not {list(before)} (node rank {old_plan.node_rank}): restart the supervisor "
            "to change them"
        )


def _report(plan: ReloadPlan) -> None:
    if not plan.changed:
        log.info("reloaded", applied=[], detail="nothing changed")
        return
    log.info(
        "reloaded",
        applied=list(plan.now),
        at_next_restart=list(plan.next_launch),
        at_next_start=list(plan.next_start),
        restart_server=plan.restart_server,
    )
    if plan.next_launch and not plan.restart_server:
        log.warning(
            "reload_pending",
            keys=list(plan.next_launch),
            detail="takes effect at the next restart of the server ([run] restart_on_reload "
            "= true restarts it at a reload)",
        )
    if plan.next_start:
        log.warning(
            "reload_pending",
            keys=list(plan.next_start),
            detail="takes effect when the supervisor restarts (systemctl restart); the old "
            "values stay in force",
        )


def live_probes(run: Callable[[], RunConfig]) -> Callable[[LaunchPlan], Callable[[], HealthStatus]]:
    """The HTTP health probe of each launch, reading `[run] health_timeout` at each check: a
    reload's timeout applies from the next one (the path, part of the URL, from the next launch).
    """
    from supervisor.adapters.health import HttpHealthProbe, health_url

    def probe_for(plan: LaunchPlan) -> Callable[[], HealthStatus]:
        probe = HttpHealthProbe(health_url(plan.host, plan.port, run().health_path))

        def check() -> HealthStatus:
            probe.timeout_s = run().health_timeout_s
            return probe.check()

        return check

    return probe_for
