"""SGLang's own `--config FILE.yaml` (launch_server's, not the supervisor's TOML), read as SGLang
reads it: PyYAML's safe loader, a `.yaml`/`.yml` suffix, a mapping at the root
(utils/server_args_config_parser.py `ConfigArgumentMerger`). core/sglang_cli.py merges it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from supervisor.atomic_file import NotRegularFile, open_regular
from supervisor.errors import ConfigError

_MAX_BYTES = 1 << 20  # a flags file; anything larger is a mistake, not a config


def config_path_of(argv: Sequence[str]) -> str | None:
    """The file after `--config` (SGLang looks for that exact token), or None."""
    indexes = [i for i, token in enumerate(argv) if token == "--config"]
    if not indexes or indexes[0] + 1 >= len(argv):
        return None  # none, or a malformed one: the argv reader says so in SGLang's words
    return argv[indexes[0] + 1]


def load_sglang_config(argv: Sequence[str]) -> Mapping[str, Any] | None:
    """The mapping of the YAML file `argv` names with `--config` (None: no --config).

    A relative path is taken from this process's working directory, which the server inherits.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or not a mapping; the message
            names the file and, for a syntax error, the line.
    """
    name = config_path_of(argv)
    if name is None:
        return None
    path = Path(name)
    where = f"launch_server --config {name}"
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"{where}: Config file must be YAML format, got: {path.suffix!r}")
    try:
        with open_regular(path) as fh:
            data = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: Config file not found: {name}") from None
    except NotRegularFile as exc:  # a FIFO would block the read for ever
        raise ConfigError(f"{where}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > _MAX_BYTES:
        raise ConfigError(f"{where}: larger than {_MAX_BYTES} bytes; not a flags file")
    try:
        loaded = yaml.safe_load(data)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise ConfigError(f"{where}:{line} {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where}: Config file must contain a dictionary at root level")
    return {str(k): v for k, v in loaded.items()}
