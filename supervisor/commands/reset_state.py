"""`sglang-supervisor reset-state`: forget the watchdog's --hicache-size override and the restart
history kept in the state file (the PIDs of the last run stay, so leftovers are still found)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from supervisor.config import load_config
from supervisor.run.state import RunState, StateStore, default_state_dir


def state_dir_for(config_path: Path | None, state_dir: Path | None, name: str | None) -> Path:
    """--state-dir, else [run] state_dir, else /var/lib/sglang-supervisor/<name>."""
    if state_dir is not None:
        return state_dir
    config = load_config(config_path)
    if config.run.state_dir:
        return Path(config.run.state_dir)
    return default_state_dir(name or config.run.name)


def reset_state(store: StateStore) -> tuple[RunState, RunState]:
    """Clear the override and the restart history; returns (before, after)."""
    before = store.load()
    after = dataclasses.replace(
        before,
        hicache_size_override_gb=None,
        override_reason=None,
        restart_count=0,
        last_failure=None,
        last_failure_hint=None,
        last_failure_at=None,
    )
    store.ensure_writable()
    store.save(after)
    return before, after


@click.command("reset-state")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Config file (its [run] name and state_dir locate the state).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="State directory (default: [run] state_dir, else /var/lib/sglang-supervisor/<name>).",
)
@click.option("--name", help="Instance name when no config file is given.")
def reset_state_command(config_path: Path | None, state_dir: Path | None, name: str | None) -> None:
    """Forget the shrunk --hicache-size and the restart count of an instance."""
    directory = state_dir_for(config_path, state_dir, name)
    before, _after = reset_state(StateStore(directory))
    if before.hicache_size_override_gb is not None:
        click.echo(
            f"cleared --hicache-size override {before.hicache_size_override_gb} GB "
            f"({before.override_reason or 'no reason recorded'})"
        )
    else:
        click.echo("no --hicache-size override was set")
    click.echo(f"restart count {before.restart_count} -> 0; state file {directory}")
