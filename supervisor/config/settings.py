"""RunSettings: everything `run` was given, the command line merged over the config file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from supervisor.config.sections import RunConfig, SupervisorConfig
from supervisor.core.group import GroupSpec
from supervisor.core.sglang_launch import LaunchReader


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """The effective settings of one `run`: config sections, the server's command and argv."""

    config: SupervisorConfig
    server_command: tuple[str, ...]
    server_args: tuple[str, ...]
    state_dir: Path
    config_dir: Path | None = None  # relative paths in the config file are looked up here
    # How the argv is read: the SGLang release's rules and its --config YAML, resolved once.
    reader: LaunchReader = dataclasses.field(default_factory=LaunchReader)
    # Group mode (docs/multi-node.md): this node's place in a multi-node group, the group's
    # flags already in server_args; None: one box.
    group: GroupSpec | None = None

    @property
    def run(self) -> RunConfig:
        return self.config.run

    @property
    def instance(self) -> str:
        return self.config.run.name
