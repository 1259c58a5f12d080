"""Which instance a command is about: `--config`, `--state-dir` or `--name`, as `status` and
`reset-state` take them, resolved to its state directory the way `run` would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from supervisor.config import load_config
from supervisor.config.sections import instance_name_problem
from supervisor.core.bounded import path_problem, shown
from supervisor.errors import ConfigError
from supervisor.run.state import default_state_dir


def instance_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--config, --state-dir and --name, passed as config_path, state_dir and name."""
    f = click.option("--name", help="Instance name when no config file is given.")(f)
    f = click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="State directory (default: [run] state_dir, else /var/lib/sglang-supervisor/<name>).",
    )(f)
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Config file (its [run] name and state_dir locate the instance).",
    )(f)


def state_dir_for(config_path: Path | None, state_dir: Path | None, name: str | None) -> Path:
    """--state-dir, else [run] state_dir, else /var/lib/sglang-supervisor/<name>.

    Raises:
        ConfigError: `name` is not an instance name (a '/' would nest directories, ".." climb
            out of the state root), a --state-dir the kernel would refuse (too long), or the
            config file is bad.
    """
    if name is not None:
        problem = instance_name_problem(name)
        if problem is not None:
            raise ConfigError(f"--name {name!r}: {problem} (the rule of [run] name)")
    if state_dir is not None:
        problem = path_problem(str(state_dir))
        if problem is not None:
            raise ConfigError(f"--state-dir {shown(str(state_dir))} {problem}")
        return state_dir
    config = load_config(config_path)
    if config.run.state_dir:
        return Path(config.run.state_dir)
    return default_state_dir(name or config.run.name)
