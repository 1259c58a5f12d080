"""`sglang-supervisor run`: parse options over the config file, wire the adapters, run the loop.

    sglang-supervisor run [--config FILE] [OPTIONS] -- <launch_server args>

Every [run] key has an option of the same name; command-line options override the config file,
which overrides the defaults. The loop itself is supervisor/run/runner.py; this module only
parses and wires the adapters to it.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import structlog

from supervisor.config import RunConfig, RunSettings, SupervisorConfig, load_config
from supervisor.core.redact import secret_values
from supervisor.core.sglang_args import ArgvError
from supervisor.core.units import parse_duration
from supervisor.errors import ConfigError, ExitCode, ServerArgsRejected, SupervisorError
from supervisor.log import register_secrets
from supervisor.preflight.reader import argv_problem, launch_reader
from supervisor.run.state import StateStore, default_state_dir

if TYPE_CHECKING:
    from supervisor.adapters.cgroup import ServerCgroup
    from supervisor.adapters.events import QueueEvents
    from supervisor.core.ports import GpuSensor, Notifier
    from supervisor.memory.guard import MemoryGuard
    from supervisor.run.runner import Runner

# Set by the shipped unit next to TimeoutStopSec (systemd tells a service nothing about it).
UNIT_STOP_TIMEOUT_ENV = "SGLANG_SUPERVISOR_STOP_TIMEOUT_S"
# Killing the tree and the kernel unpinning host memory after the grace (243 GB ~ 26 s,
# sglang PR #32829) must fit before systemd's own SIGKILL.
STOP_MARGIN_S = 30.0


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


_DURATION = "duration"  # marker in the table below: parsed by _duration
# (option, RunConfig field, click type, help). One table: the decorators are generated from it.
_RUN_OPTIONS: tuple[tuple[str, str, Any, str], ...] = (
    ("--name", "name", str, "Instance name: state in /var/lib/sglang-supervisor/NAME."),
    ("--state-dir", "state_dir", str, "Directory of the state file and incident reports."),
    ("--stop-grace", "stop_grace_s", _DURATION, "SIGTERM to SIGKILL on stop (default 60s)."),
    (
        "--worker-stop-grace",
        "worker_stop_grace_s",
        _DURATION,
        "The same on --node-rank >= 1, where SGLang does not drain (default 5s).",
    ),
    ("--health-path", "health_path", str, "Health endpoint (default /health)."),
    ("--health-interval", "health_interval_s", _DURATION, "Health check period (default 10s)."),
    ("--health-timeout", "health_timeout_s", _DURATION, "One health check's limit (25s)."),
    ("--failure-threshold", "failure_threshold", int, "Consecutive failed checks = dead (3)."),
    ("--startup-timeout", "startup_timeout_s", _DURATION, "Hard load limit (default 60min)."),
    (
        "--startup-stall-timeout",
        "startup_stall_timeout_s",
        _DURATION,
        "No progress = stuck (10min).",
    ),
    ("--backoff-initial", "backoff_initial_s", _DURATION, "First restart delay (default 10s)."),
    ("--backoff-max", "backoff_max_s", _DURATION, "Restart delay cap (default 300s)."),
    ("--stable-after", "stable_after_s", _DURATION, "Healthy this long resets the delay (10min)."),
    ("--max-restarts", "max_restarts", int, "More restarts within the window = crash loop (5)."),
    ("--restart-window", "restart_window_s", _DURATION, "Window for --max-restarts (30min)."),
    ("--oom-score-adj", "oom_score_adj", int, "oom_score_adj of the server tree (500)."),
    ("--keep-files", "keep_files", int, "Incident reports kept, the newest (100)."),
    (
        "--cgroup",
        "cgroup",
        click.Choice(["auto", "off"]),
        "Server tree in a cgroup of its own when possible (auto), or /proc only (off).",
    ),
    ("--log-format", "log_format", click.Choice(["auto", "json", "console"]), "Log rendering."),
    ("--log-level", "log_level", click.Choice(["debug", "info", "warning", "error"]), "Level."),
)
_RUN_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("auto-size", "auto_size", "On no-fit, launch with the largest --hicache-size that fits."),
    ("force", "force", "On no-fit, launch anyway."),
    ("kill-foreign-gpu-processes", "kill_foreign_gpu_processes", "Kill others on the GPUs."),
)


def _run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for flag, field, kind, help_text in reversed(_RUN_OPTIONS):
        if kind == _DURATION:
            option = click.option(
                flag, field, callback=_duration, metavar="DURATION", help=help_text
            )
        else:
            option = click.option(flag, field, type=kind, default=None, help=help_text)
        f = option(f)
    for flag, field, help_text in reversed(_RUN_FLAGS):
        f = click.option(f"--{flag}/--no-{flag}", field, default=None, help=help_text)(f)
    return f


def merge_run_config(run: RunConfig, options: Mapping[str, Any]) -> RunConfig:
    """Command-line values over the config file's [run]; validation names the key and option.

    Raises:
        ConfigError: an impossible value, or a stop grace that does not fit the unit's
            TimeoutStopSec.
    """
    given = {k: v for k, v in options.items() if v is not None}
    try:
        merged = dataclasses.replace(run, **given)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (from the config file or its command-line option)") from None
    unit_timeout = os.environ.get(UNIT_STOP_TIMEOUT_ENV)
    if unit_timeout:
        try:
            limit_s = parse_duration(unit_timeout)
        except ValueError:
            limit_s = None
        if limit_s is not None and merged.stop_grace_s + STOP_MARGIN_S > limit_s:
            raise ConfigError(
                f"config key run.stop_grace ({merged.stop_grace_s:g} s) must leave "
                f"{STOP_MARGIN_S:g} s below the unit's TimeoutStopSec ({limit_s:g} s, "
                f"{UNIT_STOP_TIMEOUT_ENV}); lower it or raise both in a drop-in"
            )
    return merged


def build_settings(
    config: SupervisorConfig,
    *,
    config_path: Path | None,
    server_args: tuple[str, ...],
    server_command: str | None,
    gpu_backend: str | None,
    run_options: Mapping[str, Any],
) -> RunSettings:
    """RunSettings from the config file and the command line."""
    from supervisor.run import launch

    run = merge_run_config(config.run, run_options)
    gpu = (
        config.gpu if gpu_backend is None else dataclasses.replace(config.gpu, backend=gpu_backend)
    )
    config = dataclasses.replace(config, run=run, gpu=gpu)
    args = server_args or config.server.args
    if not args:
        raise ConfigError(
            "no launch_server arguments: give them after -- or as [server] args in --config"
        )
    if server_command is not None:
        try:
            command = tuple(shlex.split(server_command))
        except ValueError as exc:
            raise ConfigError(f"--server-command: {exc}") from None
    else:
        command = config.server.command or launch.default_server_command()
    launch.check_server_command(command)
    reader = launch_reader(config, args, command)
    try:
        reader.plan(args)
    except ArgvError as exc:  # SGLang would exit 2 on it: refuse before starting anything
        raise ServerArgsRejected(argv_problem(exc, reader)) from None
    state_dir = Path(run.state_dir) if run.state_dir else default_state_dir(run.name)
    return RunSettings(
        config=config,
        server_command=command,
        server_args=tuple(args),
        state_dir=state_dir,
        config_dir=config_path.parent if config_path is not None else None,
        reader=reader,
    )


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config ([server], [run], [watchdog], [gpu], ...).",
)
@click.option(
    "--server-command",
    help='Command instead of "python -m sglang.launch_server" (shell-split), e.g. '
    '"/opt/sglang/.venv/bin/python -m sglang.launch_server".',
)
@click.option(
    "--gpu-backend",
    type=click.Choice(["auto", "nvml", "sim", "none"]),
    help="How to read the GPUs (default: [gpu] backend, auto).",
)
@_run_options
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def run(
    config_path: Path | None,
    server_command: str | None,
    gpu_backend: str | None,
    server_args: tuple[str, ...],
    **run_options: Any,
) -> int:
    """Launch SGLang, keep it alive, stop it cleanly (under systemd or by hand).

    \b
    sglang-supervisor run [--config FILE] [OPTIONS] -- <launch_server args>
    Exit codes: 0 stopped, 1 does not fit, 2 bad input, 3 SGLang rejected its
    arguments, 4 startup failed, 5 crash loop, 6 GPU unrecoverable, 70 internal error.
    """
    from supervisor.log import configure_logging

    # From the first moment: a refusal of the config itself is then a `fatal` event too, where
    # the log is JSON (the file's own log_format applies once it is read).
    configure_logging(str(run_options.get("log_format") or "auto"))
    config = load_config(config_path)
    settings = build_settings(
        config,
        config_path=config_path,
        server_args=server_args,
        server_command=server_command,
        gpu_backend=gpu_backend,
        run_options=run_options,
    )
    from supervisor.adapters.gpu_reset import check_reset_command

    problem = check_reset_command(settings.config.gpu.reset_command)
    if problem is not None:
        raise ConfigError(problem)
    register_secrets(
        secret_values(
            settings.reader.plan(settings.server_args),
            {**os.environ, **settings.config.server.env},
        )
    )
    store = StateStore(settings.state_dir, keep_files=settings.run.keep_files)
    store.ensure_writable()
    store.claim()
    configure_logging(settings.run.log_format, settings.run.log_level)
    return int(_run_supervisor(settings, store))


def build_runner(
    settings: RunSettings,
    store: StateStore,
    sensor: GpuSensor | None,
    guard: MemoryGuard,
    *,
    notifier: Notifier,
    events: QueueEvents,
    cgroup: ServerCgroup | None = None,
) -> Runner:
    """The production runner: real processes, HTTP health probes, the system clock."""
    from supervisor.adapters import shm
    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.gpu_reset import CommandGpuResetter
    from supervisor.adapters.health import HttpHealthProbe, health_url
    from supervisor.adapters.ledger import open_ledger
    from supervisor.adapters.processes import SystemProcesses
    from supervisor.adapters.server_process import SubprocessLauncher
    from supervisor.run.plugins import RunnerIO
    from supervisor.run.runner import Runner

    run_cfg = settings.run
    gpu = settings.config.gpu

    def probe_factory(plan: Any) -> Callable[[], Any]:
        url = health_url(plan.host, plan.port, run_cfg.health_path)
        return HttpHealthProbe(url, timeout_s=run_cfg.health_timeout_s).check

    io = RunnerIO(
        clock=SystemClock(),
        events=events,
        launcher=SubprocessLauncher(cgroup=cgroup),
        processes=SystemProcesses(),
        notifier=notifier,
        probe_factory=probe_factory,
        sensor=sensor,
        resetter=(
            CommandGpuResetter(gpu.reset_command, timeout_s=gpu.reset_timeout_s)
            if gpu.reset_command
            else None
        ),
        sweep_shm=shm.sweep,
        # A run is on this host even when its facts are given: it keeps the ledger always.
        reservations=open_ledger(settings.config.preflight.ledger_dir, settings.instance),
    )
    return Runner(settings, store, io, guard.plugins)


def _run_supervisor(settings: RunSettings, store: StateStore) -> int:
    from supervisor.adapters import events as signals
    from supervisor.adapters.server_process import become_subreaper
    from supervisor.run.containment import contain, release

    # Handlers first, then the signals held since the process started are delivered (queued as
    # events): before any child exists, since children inherit the signal mask.
    events = signals.QueueEvents()
    previous = signals.install_signal_handlers(events)
    signals.unblock_signals()
    become_subreaper()
    try:
        # Before any child (the NVML worker) starts: it then lives in our own leaf group.
        containment = contain(settings.instance, settings.run.cgroup)
        try:
            return _supervise(settings, store, containment.server, events)
        finally:
            release(containment)
    finally:
        signals.restore_signal_handlers(previous)


def _supervise(
    settings: RunSettings, store: StateStore, cgroup: ServerCgroup | None, events: QueueEvents
) -> int:
    from supervisor.adapters.systemd import SdNotifier
    from supervisor.memory.guard import MemoryGuard
    from supervisor.preflight.sensors import guarded_sensor
    from supervisor.run import launch

    log = structlog.get_logger("supervisor.run")
    gpu = settings.config.gpu
    backend = launch.resolve_gpu_backend(gpu.backend)
    sensor = (
        None
        if backend == "none"
        else guarded_sensor(
            backend, timeout_s=gpu.nvml_timeout_s, start_timeout_s=gpu.nvml_start_timeout_s
        )
    )
    guard = MemoryGuard(
        settings, store, gpu_snapshot=sensor.last_snapshot if sensor is not None else None
    )
    runner = build_runner(
        settings, store, sensor, guard, notifier=SdNotifier(), events=events, cgroup=cgroup
    )
    log.info(
        "settings",
        instance=settings.instance,
        resolved_gpu_backend=backend,
        **launch.describe_settings(settings, settings.reader.plan(settings.server_args)),
    )
    try:
        return runner.run()
    except SupervisorError:
        raise
    except Exception:  # the one broad catch: logged with traceback; the tree is already killed
        log.exception("internal_error")
        return int(ExitCode.INTERNAL)
    finally:
        if sensor is not None:
            sensor.close()


def run_with_signals(runner: Runner, events: QueueEvents) -> int:
    """Run the loop as the tree's subreaper with the signals queued as events (the demo)."""
    from supervisor.adapters.events import install_signal_handlers, restore_signal_handlers
    from supervisor.adapters.server_process import become_subreaper

    previous = install_signal_handlers(events)
    become_subreaper()
    try:
        return runner.run()
    finally:
        restore_signal_handlers(previous)
