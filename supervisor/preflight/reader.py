"""Which SGLang will read the argv, and reading it so: the version's rules and its `--config`
YAML, resolved once per command (core/sglang_launch.py does the reading).
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.adapters.sglang_version import installed_sglang_version, interpreter_for
from supervisor.config import SupervisorConfig
from supervisor.core.sglang_args import ArgvError, LaunchPlan
from supervisor.core.sglang_launch import LaunchReader
from supervisor.core.sglang_versions import (
    SglangRules,
    VersionError,
    rules_for_version,
    unsupported_problem,
)
from supervisor.errors import ConfigError


def sglang_rules(config: SupervisorConfig, command: Sequence[str] | None = None) -> SglangRules:
    """The rules of the SGLang version given, else of the one the server's interpreter has
    (`command`, default `[server] command`).

    Raises:
        ConfigError: the given version (`--sglang-version`, `[host] sglang_version`) is not a
            version number, or older than every release the supervisor has rules for.
    """
    given = config.host.sglang_version
    if given is not None:
        try:
            problem = unsupported_problem(given)
            if problem is None:
                return rules_for_version(given)
        except VersionError as exc:
            problem = str(exc)
        raise ConfigError(f"--sglang-version / [host] sglang_version: {problem}")
    server = config.server.command if command is None else command
    installed = installed_sglang_version(interpreter_for(server))
    try:
        return rules_for_version(installed)
    except VersionError:  # a local build with an odd version string: the newest rules
        return rules_for_version(None)


def launch_reader(
    config: SupervisorConfig, argv: Sequence[str], command: Sequence[str] | None = None
) -> LaunchReader:
    """The reader for this deployment: its SGLang's rules and the YAML `argv` names.

    Raises:
        ConfigError: a bad version given, or a `--config` file that is missing or not YAML.
    """
    rules = sglang_rules(config, command)
    if "--config" not in argv:  # SGLang's exact token: without it PyYAML is not even imported
        return LaunchReader(rules=rules, yaml_config=None, yaml_path=None)
    from supervisor.adapters.sglang_config import config_path_of, load_sglang_config

    return LaunchReader(
        rules=rules, yaml_config=load_sglang_config(argv), yaml_path=config_path_of(argv)
    )


def argv_problem(exc: ArgvError, reader: LaunchReader) -> str:
    """The operator's message for an argv SGLang (or the supervisor) refuses."""
    return (
        f"launch_server arguments: {exc} (read as SGLang {reader.rules.table_version} reads them)"
    )


def read_plan(reader: LaunchReader, argv: Sequence[str]) -> LaunchPlan:
    """The launch plan, argv mistakes as ConfigError (exit 2).

    Raises:
        ConfigError: what SGLang's parser refuses, in its words, or values the supervisor
            cannot use.
    """
    try:
        return reader.plan(argv)
    except ArgvError as exc:
        raise ConfigError(argv_problem(exc, reader)) from None
