"""`sglang-supervisor run`: parse options over the config file, wire the adapters, run the loop.

    sglang-supervisor run [--config FILE] [OPTIONS] -- <launch_server args>

Every [run] key has an option of the same name; options override the config file, which
overrides the defaults. The loop is supervisor/run/runner.py: this module parses and wires.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import structlog

from supervisor.commands.run_options import (
    env_option,
    merge_run_config,
    run_options,
    size_option,
    with_model_facts,
)
from supervisor.config import GpuConfig, RunSettings, SupervisorConfig, load_config
from supervisor.core.sglang_args import ArgvError
from supervisor.errors import ConfigError, ExitCode, ServerArgsRejected, SupervisorError
from supervisor.group.setup import group_contradiction, join_group
from supervisor.log import register_secrets
from supervisor.preflight.reader import argv_problem, launch_reader
from supervisor.run.state import StateStore, default_state_dir

if TYPE_CHECKING:
    from supervisor.adapters.cgroup import ServerCgroup
    from supervisor.adapters.command import CommandRunner
    from supervisor.adapters.events import QueueEvents
    from supervisor.adapters.gpu_guard import GuardedGpuSensor
    from supervisor.adapters.metrics import SupervisorMetrics
    from supervisor.core.ports import GpuResetter, GpuSensor, Notifier
    from supervisor.group.board import GroupBoard
    from supervisor.memory.guard import MemoryGuard
    from supervisor.run.plugins import ReloadHook
    from supervisor.run.runner import Runner


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
    from supervisor.adapters.credentials import resolve_credentials
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
    resolve_credentials(config.server.user, config.server.group)  # unknown names: exit 2 now
    reader = launch_reader(config, args, command)
    try:
        reader.plan(args)
    except ArgvError as exc:  # SGLang would exit 2 on it: refuse before starting anything
        # A group's variables that contradict the argv are the first cause (named by both).
        contradiction = group_contradiction(config, os.environ, args, reader)
        if contradiction is not None:
            raise ConfigError(contradiction) from None
        raise ServerArgsRejected(argv_problem(exc, reader)) from None
    try:
        # Group mode: this node's group from the launcher's variables, its flags filled in.
        group, args = join_group(config, os.environ, args, reader)
    except ArgvError as exc:
        raise ServerArgsRejected(argv_problem(exc, reader)) from None
    state_dir = Path(run.state_dir) if run.state_dir else default_state_dir(run.name)
    return RunSettings(
        config=config,
        server_command=command,
        server_args=tuple(args),
        state_dir=state_dir,
        config_dir=config_path.parent if config_path is not None else None,
        reader=reader,
        group=group,
    )


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config ([server], [run], [watchdog], [gpu], ...).",
    **env_option("--config"),
)
@click.option(
    "--server-command",
    help='Command instead of "python -m sglang.launch_server" (shell-split), e.g. '
    '"/opt/sglang/.venv/bin/python -m sglang.launch_server".',
    **env_option("--server-command"),
)
@click.option(
    "--gpu-backend",
    type=click.Choice(["auto", "nvml", "sim", "none"]),
    help="How to read the GPUs (default: [gpu] backend, auto).",
    **env_option("--gpu-backend"),
)
@click.option(
    "--model-config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="config.json for the pre-flight when the model is not on this host yet "
    "([server] model_config).",
    **env_option("--model-config"),
)
@click.option(
    "--weights",
    callback=size_option,
    metavar="SIZE",
    help="Checkpoint size when the shards are not on this host, e.g. 16.4GB ([preflight] weights).",
    **env_option("--weights"),
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what would be launched (argv, environment, limits) and exit: nothing is "
    "launched or killed, no state written.",
)
@run_options
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def run(
    config_path: Path | None,
    server_command: str | None,
    gpu_backend: str | None,
    model_config: Path | None,
    weights: int | None,
    dry_run: bool,
    server_args: tuple[str, ...],
    **run_options: Any,
) -> int:
    """Launch SGLang, keep it alive, stop it cleanly (systemd, a pod, or by hand).

    \b
    sglang-supervisor run [--config FILE] [OPTIONS] -- <launch_server args>
    Exit codes: 0 stopped, 1 does not fit, 2 bad input, 3 SGLang rejected its
    arguments, 4 startup failed, 5 crash loop, 6 GPU unrecoverable, 8 the group
    must be recreated (group mode: docs/multi-node.md), 70 internal error.
    """
    from supervisor.commands.check_config import print_preview, start_problem
    from supervisor.log import configure_logging, is_structured
    from supervisor.run.reload import secrets_of

    # From the first moment: a refusal of the config itself is then a `fatal` event too, where
    # the log is JSON (the file's own log_format applies once it is read).
    configure_logging(str(run_options.get("log_format") or "auto"))

    def read_settings() -> RunSettings:
        """The file under the options: at start, and again at each reload (SIGHUP)."""
        config = with_model_facts(load_config(config_path), model_config, weights)
        settings = build_settings(
            config,
            config_path=config_path,
            server_args=server_args,
            server_command=server_command,
            gpu_backend=gpu_backend,
            run_options=run_options,
        )
        problem = start_problem(settings)
        if problem is not None:
            raise ConfigError(problem)
        return settings

    settings = read_settings()
    register_secrets(secrets_of(settings))
    if dry_run:
        return print_preview(settings, as_json=is_structured())
    store = StateStore(settings.state_dir, keep_files=settings.run.keep_files)
    store.ensure_writable()
    store.claim()
    configure_logging(
        settings.run.log_format,
        settings.run.log_level,
        server_output=settings.config.log.server_output,
    )
    return int(_run_supervisor(settings, store, read_settings if config_path else None))


def build_runner(
    settings: RunSettings,
    store: StateStore,
    sensor: GpuSensor | None,
    guard: MemoryGuard,
    *,
    notifier: Notifier,
    events: QueueEvents,
    cgroup: ServerCgroup | None = None,
    reload_settings: Callable[[], RunSettings] | None = None,
    reload_hooks: tuple[ReloadHook, ...] = (),
    board: GroupBoard | None = None,
    launcher: CommandRunner | None = None,
    metrics: SupervisorMetrics | None = None,
) -> Runner:
    """The production runner: real processes, HTTP probes, the system clock; `reload_settings`
    reads the settings again at a SIGHUP (None: no file); `launcher` contains the reset command."""
    from supervisor.adapters import shm
    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.credentials import resolve_credentials
    from supervisor.adapters.ledger import open_ledger
    from supervisor.adapters.listeners import check_port
    from supervisor.adapters.processes import SystemProcesses
    from supervisor.adapters.server_process import SubprocessLauncher
    from supervisor.group.setup import node_handshake
    from supervisor.memory.incident import opener
    from supervisor.run.gpu_events import merged, watch_plugins
    from supervisor.run.group_mode import group_plugins
    from supervisor.run.metrics import tree_memory_plugins
    from supervisor.run.plugins import RunnerIO
    from supervisor.run.reload import live_probes
    from supervisor.run.runner import Runner

    gpu, server = settings.config.gpu, settings.config.server
    io = RunnerIO(
        clock=SystemClock(),
        events=events,
        launcher=SubprocessLauncher(
            cgroup=cgroup,
            credentials=resolve_credentials(server.user, server.group, kept_env=server.env),
        ),
        processes=SystemProcesses(),
        notifier=notifier,
        probe_factory=live_probes(lambda: runner.run_cfg),
        sensor=sensor,
        resetter=_resetter(gpu, launcher),
        sweep_shm=shm.sweep,
        # A run is on this host even when its facts are given: it keeps the ledger always.
        reservations=open_ledger(settings.config.preflight.ledger_dir, settings.instance),
        reload_settings=reload_settings,
        group=node_handshake(settings.group, settings.config, os.environ, board),
        port_check=check_port,
    )
    xid_incident = opener(settings.state_dir, "gpu_xid", settings.run.keep_files)
    events_watch = watch_plugins(sensor, store, xid_incident)
    live = tree_memory_plugins(metrics)
    plugins = merged(guard.plugins, events_watch, group_plugins(settings), live)
    plugins = dataclasses.replace(plugins, reload_hooks=(*plugins.reload_hooks, *reload_hooks))
    runner = Runner(settings, store, io, plugins)
    return runner


def _resetter(gpu: GpuConfig, launcher: CommandRunner | None) -> GpuResetter | None:
    """The configured GPU reset command, run contained by `launcher`; None without one."""
    from supervisor.adapters.gpu_reset import CommandGpuResetter

    if not gpu.reset_command:
        return None
    return CommandGpuResetter(gpu.reset_command, timeout_s=gpu.reset_timeout_s, launcher=launcher)


def _run_sensor(gpu: GpuConfig, backend: str) -> GuardedGpuSensor | None:
    """`run`'s NVML worker (None: backend none), left alone after a hang per nvml_retry_after_s."""
    from supervisor.core.gpu_release import nvml_retry_after_s
    from supervisor.preflight.sensors import guarded_sensor

    if backend == "none":
        return None
    return guarded_sensor(
        backend,
        timeout_s=gpu.nvml_timeout_s,
        start_timeout_s=gpu.nvml_start_timeout_s,
        retry_after_s=functools.partial(nvml_retry_after_s, gpu.release_timeout_s),
    )


def _run_supervisor(
    settings: RunSettings,
    store: StateStore,
    reload_settings: Callable[[], RunSettings] | None = None,
) -> int:
    from supervisor.adapters import events as signals
    from supervisor.adapters.command import CommandRunner
    from supervisor.adapters.server_process import become_subreaper
    from supervisor.group.setup import leader_board
    from supervisor.run.containment import contain, release
    from supervisor.run.metrics import serve_metrics

    # Handlers first, then the signals held since the process started are delivered (queued as
    # events): before any child exists, since children inherit the signal mask.
    events = signals.QueueEvents()
    previous = signals.install_signal_handlers(events)
    signals.unblock_signals()
    become_subreaper()
    try:
        # Before any child (the NVML worker) starts: it then lives in our own leaf group.
        containment = contain(settings.instance, settings.run.cgroup)
        # Hooks and GPU resets: each in a leaf of the helpers' group, or found by its mark.
        launcher = CommandRunner(helpers_dir=containment.helpers_dir, instance=settings.instance)
        try:
            # The leader's board: the group's endpoints on the listener, the decision in the loop.
            board = leader_board(settings.group, settings.config.group, os.environ)
            with serve_metrics(settings, board) as metrics:  # before the first launch to the end
                return _supervise(
                    settings,
                    store,
                    containment.server,
                    events,
                    reload_settings,
                    board,
                    launcher,
                    metrics,
                    killed_at_start=containment.leftovers,
                )
        finally:
            left = launcher.close()  # nothing a hook or a reset started outlives the run
            if left:
                structlog.get_logger("supervisor.run").warning("helpers_killed", pids=list(left))
            release(containment)
    finally:
        signals.restore_signal_handlers(previous)


def _supervise(
    settings: RunSettings,
    store: StateStore,
    cgroup: ServerCgroup | None,
    events: QueueEvents,
    reload_settings: Callable[[], RunSettings] | None = None,
    board: GroupBoard | None = None,
    launcher: CommandRunner | None = None,
    metrics: SupervisorMetrics | None = None,
    killed_at_start: Sequence[int] = (),
) -> int:
    from supervisor.adapters.systemd import SdNotifier
    from supervisor.memory.guard import MemoryGuard
    from supervisor.run import launch
    from supervisor.run.hooks import NotificationHooks
    from supervisor.run.status_report import publishing_status

    log = structlog.get_logger("supervisor.run")
    backend = launch.resolve_gpu_backend(settings.config.gpu.backend)
    sensor = _run_sensor(settings.config.gpu, backend)
    guard = MemoryGuard(
        settings, store, gpu_snapshot=sensor.last_snapshot if sensor is not None else None
    )
    notifier = SdNotifier()
    hooks = NotificationHooks(settings, launcher)  # [hooks]: from before the first launch on
    runner = build_runner(
        settings,
        store,
        sensor,
        guard,
        notifier=notifier,
        events=events,
        cgroup=cgroup,
        reload_settings=reload_settings,
        reload_hooks=(hooks.reload,),
        board=board,
        launcher=launcher,
        metrics=metrics,
    )
    runner.contained_leftovers = tuple(killed_at_start)
    log.info(
        "settings",
        instance=settings.instance,
        resolved_gpu_backend=backend,
        **launch.describe_settings(settings, settings.reader.plan(settings.server_args)),
    )
    try:
        with publishing_status(settings, notifier):  # status.json, the load's progress
            rc = runner.run()
        notifier.report_drops(at_exit=True)  # after a fatal end, `fatal` stays the last event
        return rc
    except SupervisorError:
        raise
    except Exception:  # the one broad catch: logged with traceback; the tree is already killed
        log.exception("internal_error")
        return int(ExitCode.INTERNAL)
    finally:
        hooks.close()  # after the fatal event: its hook runs (bounded) before the exit
        if sensor is not None:
            sensor.close()
