"""`sglang-supervisor reset-state`: forget the watchdog's --hicache-size override and the restart
history kept in the state file (the PIDs of the last run stay, so leftovers are still found)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from supervisor.commands.instance import instance_options, state_dir_for
from supervisor.errors import ConfigError
from supervisor.run.state import RunState, StateStore


def reset_state(store: StateStore) -> tuple[RunState, RunState]:
    """Clear the override and the restart history; returns (before, after).

    Under the state directory's lock, the one `run` holds for its whole life: a live supervisor
    would write its own state over the reset (or read it halfway).

    Raises:
        ConfigError: the directory is not writable, or a live supervisor holds it (its PID).
    """
    store.ensure_writable()
    store.claim()
    try:
        before = store.load()
        after = dataclasses.replace(
            before,
            hicache_size_override_gb=None,
            override_reason=None,
            override_set_at=None,
            restart_count=0,
            restart_times=(),
            last_failure=None,
            last_failure_hint=None,
            last_failure_at=None,
        )
        store.save(after)
    finally:
        store.release()
    return before, after


def check_instance_exists(directory: Path, *, force: bool) -> None:
    """Refuse an instance that never ran: a misspelt --name would otherwise "reset" (and
    create) a state directory of its own, exit 0, and the operator would think the real one
    was cleared.

    Raises:
        ConfigError: `directory` does not exist and `force` is not given.
    """
    if force:
        return
    try:
        directory.stat()
    except FileNotFoundError:
        raise ConfigError(
            f"no instance has state in {directory} (it does not exist): check --name, "
            "--state-dir or the config's [run] name and state_dir; --force creates it"
        ) from None
    except OSError:
        return  # not a directory, a loop: reset_state names the problem


@click.command("reset-state")
@instance_options
@click.option("--force", is_flag=True, help="Reset (and create) a state directory never used.")
def reset_state_command(
    config_path: Path | None, state_dir: Path | None, name: str | None, force: bool
) -> None:
    """Forget the shrunk --hicache-size and the restart count of an instance."""
    directory = state_dir_for(config_path, state_dir, name)
    check_instance_exists(directory, force=force)
    before, _after = reset_state(StateStore(directory))
    if before.hicache_size_override_gb is not None:
        click.echo(
            f"cleared --hicache-size override {before.hicache_size_override_gb} GB "
            f"({before.override_reason or 'no reason recorded'})"
        )
    else:
        click.echo("no --hicache-size override was set")
    click.echo(f"restart count {before.restart_count} -> 0; state file {directory}")
