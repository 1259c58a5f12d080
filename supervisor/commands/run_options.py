"""`run`'s options: every [run] key as an option (and a SGLANG_SUPERVISOR_<OPTION> variable),
merged over the config file, and the model facts --model-config / --weights give the pre-flight.

Precedence: command line > environment > config file > defaults.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from supervisor.config import RunConfig, SupervisorConfig
from supervisor.core.units import parse_duration, parse_size
from supervisor.errors import ConfigError

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


def size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
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
    ("--health-timeout", "health_timeout_s", _DURATION, "Check limit (25s, >= 2s on /health)."),
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
    (
        "--log-format",
        "log_format",
        click.Choice(["auto", "json", "console", "journal"]),
        "Log lines: auto = console on a terminal, journal when stderr is the journal, else json.",
    ),
    ("--log-level", "log_level", click.Choice(["debug", "info", "warning", "error"]), "Level."),
)
_RUN_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("auto-size", "auto_size", "On no-fit, launch with the largest --hicache-size that fits."),
    ("force", "force", "On no-fit or a failed GPU health check, launch anyway."),
    ("kill-foreign-gpu-processes", "kill_foreign_gpu_processes", "Kill others on the GPUs."),
    (
        "restart-on-reload",
        "restart_on_reload",
        "On SIGHUP, relaunch the server at once for a changed argv or environment.",
    ),
)


def run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for flag, field, kind, help_text in reversed(_RUN_OPTIONS):
        if kind == _DURATION:
            option = click.option(
                flag,
                field,
                callback=_duration,
                metavar="DURATION",
                help=help_text,
                **env_option(flag),
            )
        else:
            option = click.option(
                flag, field, type=kind, default=None, help=help_text, **env_option(flag)
            )
        f = option(f)
    for flag, field, help_text in reversed(_RUN_FLAGS):
        f = click.option(
            f"--{flag}/--no-{flag}", field, default=None, help=help_text, **env_option(flag)
        )(f)
    return f


def env_option(flag: str) -> dict[str, Any]:
    """Each option also reads SGLANG_SUPERVISOR_<OPTION> (shown in --help); the command line
    wins over it, and both over the config file."""
    name = "SGLANG_SUPERVISOR_" + flag.lstrip("-").upper().replace("-", "_")
    return {"envvar": name, "show_envvar": True}


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
        from supervisor.commands.check_config import value_source

        raise ConfigError(f"{exc} ({value_source(str(exc), given)})") from None
    unit_timeout = os.environ.get(UNIT_STOP_TIMEOUT_ENV)
    if unit_timeout:
        # A value that does not parse must not switch the guard off unseen: the unit sets it.
        try:
            limit_s = parse_duration(unit_timeout)
        except ValueError as exc:
            raise ConfigError(
                f"environment variable {UNIT_STOP_TIMEOUT_ENV}: {exc} (the unit sets it beside "
                "TimeoutStopSec, e.g. 90s)"
            ) from None
        if merged.stop_grace_s + STOP_MARGIN_S > limit_s:
            raise ConfigError(
                f"config key run.stop_grace ({merged.stop_grace_s:g} s) must leave "
                f"{STOP_MARGIN_S:g} s below the unit's TimeoutStopSec ({limit_s:g} s, "
                f"{UNIT_STOP_TIMEOUT_ENV}); lower it or raise both in a drop-in"
            )
    return merged


def with_model_facts(
    config: SupervisorConfig, model_config: Path | None, weights_bytes: int | None
) -> SupervisorConfig:
    """--model-config and --weights over [server] model_config and [preflight] weights."""
    if model_config is not None:
        # Relative to where the command runs (the key's value is relative to the config file).
        server = dataclasses.replace(config.server, model_config=str(model_config.absolute()))
        config = dataclasses.replace(config, server=server)
    if weights_bytes is not None:
        preflight = dataclasses.replace(config.preflight, weights_bytes=weights_bytes)
        config = dataclasses.replace(config, preflight=preflight)
    return config
