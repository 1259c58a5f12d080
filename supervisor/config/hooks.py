"""The `[hooks]` section: commands run on `ready`, `fatal` and a written incident (earlyoom -N).

A command is a string (split like a shell would, but no shell runs it) or a list of strings;
each argument may hold `{incident_file}`, `{instance}` and `{kind}` (core/hooks.py).
"""

from __future__ import annotations

import dataclasses

from supervisor.config.limits import check_limits
from supervisor.errors import ConfigError

# The loader accepts a string for these fields and shell-splits it.
COMMAND = {"command": True}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HooksConfig:
    """Notification hooks: each runs in the background, killed after `timeout`."""

    on_incident: tuple[str, ...] = dataclasses.field(default=(), metadata=COMMAND)
    on_fatal: tuple[str, ...] = dataclasses.field(default=(), metadata=COMMAND)
    on_ready: tuple[str, ...] = dataclasses.field(default=(), metadata=COMMAND)
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"config key hooks.timeout must be positive (got {self.timeout_s})")
        check_limits(self, "hooks")
        commands = {name: words for name, words in self.commands().items() if words}
        if not commands:
            return
        # Only a config with hooks pays for their rules: every pre-flight loads this section.
        from supervisor.core.hooks import placeholder_problem

        for name, words in commands.items():
            problem = placeholder_problem(words)
            if problem is not None:
                raise ConfigError(f"config key hooks.{name}: {problem}")

    def commands(self) -> dict[str, tuple[str, ...]]:
        """Hook name -> its argv (empty: not set)."""
        return {
            "on_incident": self.on_incident,
            "on_fatal": self.on_fatal,
            "on_ready": self.on_ready,
        }
