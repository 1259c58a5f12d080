"""How one deployment's launch_server argv is read: the release's rules and its `--config` YAML.

The reader is built once per command (the version resolved, the YAML file loaded by the shell)
and then turns every argv of that deployment into a LaunchPlan, so the pre-flight, the run loop
and restart-smaller all see the ranks and pools SGLang will see, including what the YAML sets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.sglang_args import LaunchPlan, parse_launch_args
from supervisor.core.sglang_versions import SglangRules, rules_for_version


@dataclass(frozen=True, slots=True)
class LaunchReader:
    """The rules of the SGLang that will run, and the `--config` file's mapping (if any)."""

    rules: SglangRules = field(default_factory=lambda: rules_for_version(None))
    yaml_config: Mapping[str, Any] | None = None  # read once, when the command started
    yaml_path: str | None = None

    def plan(self, argv: Sequence[str]) -> LaunchPlan:
        """The plan of `argv` as this release reads it, the YAML merged in.

        Raises:
            ArgvError: what that release's argparse refuses, or values the supervisor cannot use.
        """
        return parse_launch_args(argv, self.rules.cli(), self.yaml_config)

    def notes(self, plan: LaunchPlan) -> tuple[str, ...]:
        """What SGLang accepts silently but an operator should hear about (warnings)."""
        out = []
        if plan.repeated:
            flags = ", ".join(plan.repeated)
            out.append(f"given more than once, SGLang takes the last value: {flags}")
        if plan.unknown:
            out.append(
                f"SGLang {self.rules.version} is newer than the newest flag table "
                f"({self.rules.table_version}); passed on unchecked: {', '.join(plan.unknown)}"
            )
        return tuple(out)
