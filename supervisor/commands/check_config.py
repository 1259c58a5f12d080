"""`sglang-supervisor check-config FILE` and `run --dry-run`: everything `run` checks before it
starts (the config, the server's command and argv, the hooks, the pre-flight with --auto-size
and --force) and what it would launch. Nothing is launched or killed (no leftover cleanup), no
state or ledger entry is written: the state file is only read, for its --hicache-size override.

Also what `run` checks at start and at a reload beyond the config's own validation, and where
a bad option value came from (its option or its SGLANG_SUPERVISOR_<OPTION> variable).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from supervisor.adapters.clock import SystemClock
from supervisor.atomic_file import NotRegularFile, open_regular
from supervisor.config import RunSettings
from supervisor.config.loader import toml_key
from supervisor.core.bounded import parse_json
from supervisor.core.checks import FitReport, Status
from supervisor.core.ledger import Reservation
from supervisor.core.ports import ReservationBook
from supervisor.core.redact import redact_words
from supervisor.core.sglang_args import redact_argv
from supervisor.core.shrink import override_expired
from supervisor.core.units import format_bytes
from supervisor.errors import ConfigError, ExitCode, ServerArgsRejected
from supervisor.log import scrub
from supervisor.run.state import STATE_FILE, RunState


def value_source(message: str, given: Mapping[str, object]) -> str:
    """Where the value an error `message` names came from: the option or environment variable
    of the given `run` option it names first, else the config file."""
    ctx = click.get_current_context(silent=True)
    named = [(message.find(f"run.{toml_key(f)}"), f) for f in given]
    found = sorted((pos, f) for pos, f in named if pos >= 0)
    if ctx is None or not found:
        return "from the config file"
    field = found[0][1]
    param = next((p for p in ctx.command.params if p.name == field), None)
    if param is None:
        return "from the config file"
    if ctx.get_parameter_source(field) is ParameterSource.ENVIRONMENT:
        return f"from the environment variable {param.envvar}"
    return f"from the option {param.opts[0]}"


def start_problem(settings: RunSettings) -> str | None:
    """What `run` refuses to start with beyond the config's own validation (the GPU reset
    command, the metrics, the hooks), or None; checked at start, at a reload and by
    check-config alike."""
    from supervisor.adapters.gpu_reset import check_reset_command
    from supervisor.adapters.hooks import command_problem
    from supervisor.run.metrics import metrics_problem

    problem = check_reset_command(settings.config.gpu.reset_command) or metrics_problem(settings)
    for name, argv in settings.config.hooks.commands().items():
        problem = problem or command_problem(name, argv)
    return problem


# -- the state, read only ----------------------------------------------------------------------


def peek_state(state_dir: Path) -> tuple[RunState, str | None]:
    """The state file as `run` would find it, without setting a damaged one aside; (state, a
    note when it is damaged)."""
    path = state_dir / STATE_FILE
    try:
        with open_regular(path, follow_symlinks=False) as f:  # never through a link
            raw = f.read()
    except FileNotFoundError:
        return RunState(), None
    except NotRegularFile as exc:
        return RunState(), f"{exc}: run sets it aside and starts afresh"
    except OSError as exc:
        return RunState(), f"unreadable ({exc.strerror or exc}): run starts with a fresh state"
    try:
        return RunState.from_json(parse_json(raw.decode("utf-8"))), None
    except (ValueError, TypeError, KeyError) as exc:
        return RunState(), f"damaged ({exc}): run sets it aside and starts afresh"


class _ReadOnlyLedger:
    """The host ledger for a pre-flight that reserves nothing: others' plans count, ours is not
    written."""

    def __init__(self, others: tuple[Reservation, ...]) -> None:
        self._others = others

    @contextlib.contextmanager
    def session(self) -> Iterator[ReservationBook]:
        yield self

    def others(self) -> tuple[Reservation, ...]:
        return self._others

    def set(self, planned_bytes: int, pinned_bytes: int = 0) -> None:
        return None

    def drop(self) -> None:
        return None


# -- the preview -------------------------------------------------------------------------------


def preview(settings: RunSettings) -> dict[str, Any]:
    """What `run` would launch with these settings, after the override and the pre-flight gate.

    Raises:
        PreflightFailed: the pre-flight refuses the launch (exit 1).
        ConfigError: the pre-flight cannot run (exit 2).
    """
    from supervisor.adapters.ledger import open_ledger
    from supervisor.preflight.sensors import LazySensor
    from supervisor.run import launch
    from supervisor.run.override import apply_override, override_times

    state, state_note = peek_state(settings.state_dir)
    expires_s = settings.config.watchdog.shrink_expires_s
    expired = override_expired(state.override_set_at, expires_s, SystemClock().wall())
    if state.hicache_size_override_gb is not None and expired:
        state_note = f"the --hicache-size {state.hicache_size_override_gb} override has expired"
        state = dataclasses.replace(state, hicache_size_override_gb=None, override_set_at=None)
    argv = apply_override(settings.server_args, state, expires_s=expires_s)
    backend = launch.resolve_gpu_backend(settings.config.gpu.backend)
    sensor = None if backend == "none" else LazySensor(backend)
    ledger = open_ledger(settings.config.preflight.ledger_dir, settings.instance)
    book = _ReadOnlyLedger(ledger.others() if ledger is not None else ())
    try:
        argv, fit = launch.preflight_gate(settings, argv, sensor, book)
    finally:
        if sensor is not None:
            sensor.close()
    override = None
    if state.hicache_size_override_gb is not None:
        override = {
            "hicache_size_gb": state.hicache_size_override_gb,
            "reason": state.override_reason,
            **override_times(state, expires_s),
        }
    # Masked as the log is (the secrets registered): a hook's token, a secret in the command.
    view: dict[str, Any] = scrub(
        {
            "instance": settings.instance,
            "state_dir": str(settings.state_dir),
            "state_note": state_note,
            "command": list(redact_words(redact_argv(settings.server_command))),
            "argv": list(redact_argv(argv)),
            "group": _group(settings),
            "override": override,
            "preflight": _preflight(fit),
            "environment": environment(settings),
            "limits": limits(settings, fit, settings.reader.plan(argv)),
        }
    )
    return view


def _group(settings: RunSettings) -> dict[str, Any] | None:
    """Group mode as `run` would join it (docs/multi-node.md); the token is never shown."""
    from supervisor.group.setup import describe, leader_url

    if settings.group is None:
        return None
    worker = not settings.group.is_leader
    leader = leader_url(settings.group, settings.config, os.environ) if worker else None
    return {**describe(settings.group), "leader_report_url": leader, "token": "***"}


def _preflight(fit: FitReport | None) -> dict[str, Any]:
    if fit is None:
        return {"verdict": "skipped (--force)"}
    return {
        "verdict": fit.verdict if fit.fits else "no-fit (launched anyway: --force)",
        "warnings": [f"{c.name}: {c.detail}" for c in fit.checks if c.status is Status.WARN],
        "host_required_bytes": fit.host_required_bytes,
        "host_budget_bytes": fit.host_budget_bytes,
        "max_hicache_size_gb": fit.max_hicache_size_gb,
    }


def environment(settings: RunSettings) -> dict[str, Any]:
    """The variables the config adds to the server's environment (secrets masked) and how many
    it inherits from the supervisor's own."""
    from supervisor.adapters.procfs import INSTANCE_ENV, RUN_ENV, SUPERVISOR_ENV
    from supervisor.core.redact import redact_env
    from supervisor.run.launch import server_env

    markers = (INSTANCE_ENV, RUN_ENV, SUPERVISOR_ENV)  # run's own, to find leftovers by
    env = server_env(settings, "", supervisor_mark="")
    env = {k: v for k, v in env.items() if k not in markers}
    added = {k: v for k, v in env.items() if os.environ.get(k) != v}
    return {"added": redact_env(added), "inherited": len(env) - len(added)}


def limits(settings: RunSettings, fit: FitReport | None, plan: Any) -> dict[str, Any]:
    """Health, startup, restart budget, stop, watchdog and hooks as they would be in force."""
    from supervisor.adapters.health import health_url
    from supervisor.memory.guard import limits_from_config

    run, dog, hooks = settings.run, settings.config.watchdog, settings.config.hooks
    levels = limits_from_config(dog, fit.host_required_bytes if fit is not None else None)
    return {
        "health": {
            "url": health_url(plan.host, plan.port, run.health_path),
            "interval_s": run.health_interval_s,
            "timeout_s": run.health_timeout_s,
            "failure_threshold": run.failure_threshold,
        },
        "startup": {"stall_s": run.startup_stall_timeout_s, "timeout_s": run.startup_timeout_s},
        "restarts": {
            # group mode: a failure ends the node with exit 8, the launcher recreates the group
            "in_place": settings.group is None,
            "backoff_initial_s": run.backoff_initial_s,
            "backoff_max_s": run.backoff_max_s,
            "stable_after_s": run.stable_after_s,
            "max_restarts": run.max_restarts,
            "restart_window_s": run.restart_window_s,
            "restart_on_reload": run.restart_on_reload,
        },
        "stop": {"grace_s": run.stop_grace_s, "worker_grace_s": run.worker_stop_grace_s},
        "watchdog": {
            "enabled": dog.enabled,
            **{
                name: {"available_bytes": level.bytes_, "available_percent": level.percent}
                for name, level in (
                    ("warn", levels.warn),
                    ("terminate", levels.terminate),
                    ("kill", levels.kill),
                )
            },
            "tree_budget_bytes": levels.tree_budget_bytes,
            "tree_kill_bytes": levels.tree_kill_bytes,
            "shrink_factor": dog.shrink_factor,
            "shrink_expires_s": dog.shrink_expires_s or None,
        },
        "hooks": {
            **{k: list(redact_words(v)) or None for k, v in hooks.commands().items()},
            "timeout_s": hooks.timeout_s,
        },
    }


def render_text(view: Mapping[str, Any]) -> str:
    """The preview for a human: one line per item, sizes with units."""
    lines = [f"instance    {view['instance']} (state {view['state_dir']})"]
    if view["state_note"]:
        lines.append(f"state       {view['state_note']}")
    lines.append(f"command     {' '.join(view['command'])}")
    lines.append(f"argv        {' '.join(view['argv'])}")
    if (group := view.get("group")) is not None:
        leader = group["leader_report_url"]
        role = "leader" if leader is None else f"worker, reports to {leader}"
        lines.append(
            f"group       {group['mode']}: node {group['node_rank']} of {group['size']} ({role}); "
            f"--dist-init-addr {group['dist_init_addr']}, gate port {group['gate_port'] or 'none'}"
        )
    if (override := view["override"]) is not None:
        lines.append(
            f"override    --hicache-size {override['hicache_size_gb']} GB since "
            f"{override['since'] or 'an unknown time'}, expires {override['expires']} "
            f"({override['reason'] or 'no reason recorded'})"
        )
    pre = view["preflight"]
    needed = pre.get("host_required_bytes")
    detail = f": needs {_size(needed)} of {_size(pre['host_budget_bytes'])}" if needed else ""
    lines.append(f"pre-flight  {pre['verdict']}{detail}")
    lines += [f"            warn {note}" for note in pre.get("warnings", ())]
    env = view["environment"]
    added = " ".join(f"{k}={v}" for k, v in sorted(env["added"].items())) or "nothing"
    lines.append(f"environment {added}; {env['inherited']} variables inherited")
    return "\n".join([*lines, *_limit_lines(view["limits"])])


def _restart_line(restarts: Mapping[str, Any]) -> str:
    loop = f"crash loop: more than {restarts['max_restarts']} in {restarts['restart_window_s']:g} s"
    if not restarts["in_place"]:
        return f"restarts    never in place (group mode): a failure ends this node, exit 8; {loop}"
    return (
        f"restarts    after {restarts['backoff_initial_s']:g} s doubling to "
        f"{restarts['backoff_max_s']:g} s (reset after {restarts['stable_after_s']:g} s "
        f"ready); {loop}; restart_on_reload {str(restarts['restart_on_reload']).lower()}"
    )


def _limit_lines(limits: Mapping[str, Any]) -> list[str]:
    health, startup, restarts = limits["health"], limits["startup"], limits["restarts"]
    stop, dog, hooks = limits["stop"], limits["watchdog"], limits["hooks"]
    levels = ", ".join(
        f"{name} {_size(dog[name]['available_bytes'])} / {dog[name]['available_percent'] or 0:g} %"
        for name in ("warn", "terminate", "kill")
    )
    expires = dog["shrink_expires_s"]
    called = [f"{k}: {' '.join(v)}" for k, v in hooks.items() if k != "timeout_s" and v]
    return [
        f"health      GET {health['url']} every {health['interval_s']:g} s, timeout "
        f"{health['timeout_s']:g} s, dead after {health['failure_threshold']} failures",
        f"startup     stuck after {startup['stall_s']:g} s without progress, at most "
        f"{startup['timeout_s']:g} s",
        _restart_line(restarts),
        f"stop        SIGTERM, {stop['grace_s']:g} s to drain ({stop['worker_grace_s']:g} s on "
        "worker nodes), then SIGKILL",
        f"watchdog    {'on' if dog['enabled'] else 'off'}: {levels} of host headroom; tree "
        f"budget {_size(dog['tree_budget_bytes'])}, killed above {_size(dog['tree_kill_bytes'])}"
        f"; shrink × {dog['shrink_factor']:g}, "
        + (f"override expires after {expires:g} s" if expires else "override kept until reset"),
        f"hooks       {'; '.join(called) or 'none'} (timeout {hooks['timeout_s']:g} s)",
    ]


def _size(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else format_bytes(n_bytes)


def print_preview(settings: RunSettings, *, as_json: bool) -> int:
    """`run --dry-run`: the preview on stdout (JSON when the log is); exit 0."""
    view = preview(settings)
    click.echo(json.dumps(view) if as_json else render_text(view))
    return int(ExitCode.OK)


# -- check-config --------------------------------------------------------------------------------


@click.command("check-config")
@click.argument("config_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def check_config(config_path: Path, as_json: bool) -> int:
    """Check a config file as `run` would, pre-flight included; start nothing.

    \b
    Nothing is launched or killed and no state is written.
    Exit codes: 0 ok, 1 the pre-flight refuses, 2 a bad config.
    """
    from supervisor.commands.run import build_settings
    from supervisor.config import load_config
    from supervisor.log import configure_logging, register_secrets
    from supervisor.run.reload import secrets_of

    configure_logging("json" if as_json else "console", "warning")
    try:
        settings = build_settings(
            load_config(config_path),
            config_path=config_path,
            server_args=(),
            server_command=None,
            gpu_backend=None,
            run_options={},
        )
    except ServerArgsRejected as exc:  # SGLang would refuse the [server] args: a bad config
        raise ConfigError(str(exc)) from None
    problem = start_problem(settings)
    if problem is not None:
        raise ConfigError(problem)
    register_secrets(secrets_of(settings))
    view = preview(settings)
    if as_json:
        click.echo(json.dumps({"config": str(config_path), "ok": True, **view}))
    else:
        click.echo(f"config      {config_path}: valid\n{render_text(view)}")
    return int(ExitCode.OK)
