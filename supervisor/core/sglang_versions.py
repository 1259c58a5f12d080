"""Which SGLang behaviours apply to which release, and which flag table reads its argv.

Every entry of BEHAVIOURS was read from the released wheels (docs/sglang.md §8) and is checked
against them by scripts/contract. An unknown version (not installed, not given) gets the newest
rules; a release newer than every table gets the newest table and its unknown flags pass
through, so a new SGLang is never blocked by an old table.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from supervisor.core import sglang_cli_data, sglang_cli_history
from supervisor.core.sglang_cli import CliFlag, CliRules, CliTable

Version = tuple[int, ...]

# behaviour -> the first release that has it; the releases before it (back to the oldest
# table) do not. "Since the oldest table" is written as the oldest release.
BEHAVIOURS: dict[str, str] = {
    # host_memory_budget_bytes divides (MemAvailable − 10 GiB) by ranks_per_host (PR #35540)
    "divided_host_check": "0.5.19",
    # HiCache auto-sizing when neither --hicache-size nor --hicache-ratio (PR #40135)
    "auto_sizing": "0.5.21",
    # --hicache-host-memory-mode buffer_only, whose default ratio is 1.2 instead of 2.0
    "buffer_only_mode": "0.5.19",
    # _split_hicache_size: hybrid models share --hicache-size across their pools
    "hybrid_split": "0.5.18",
    # --gated-launch-port: ranks wait before large GPU allocations until /gate/activate
    "gated_launch": "0.5.19",
    # a --config YAML key may be any long spelling of a flag, not only its dest
    "yaml_any_spelling": "0.5.23",
}
_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-_a-z0-9]*)\s*$", re.IGNORECASE)


class VersionError(ValueError):
    """Not an SGLang version number (e.g. `banana`)."""


def parse_version(text: str) -> Version:
    """(major, minor, patch) of a release string such as 0.5.23 or 0.5.23.post1.

    Raises:
        VersionError: the text is not a version number.
    """
    match = _VERSION.match(text)
    if not match:
        raise VersionError(f"{text!r} is not an SGLang version (example: 0.5.23)")
    return tuple(int(x) if x is not None else 0 for x in match.groups())


def unsupported_problem(version: str) -> str | None:
    """Why the supervisor has no rules for `version`, or None: a release older than the oldest
    table (its formulas and flags were never read); a newer one gets the newest rules.

    Raises:
        VersionError: the text is not a version number.
    """
    oldest = sglang_cli_data.VERSIONS[0]
    if parse_version(version) >= parse_version(oldest):
        return None
    return (
        f"{version} is older than every SGLang release whose rules the supervisor knows "
        f"({oldest} to {sglang_cli_data.NEWEST}; a newer one gets {sglang_cli_data.NEWEST}'s)"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SglangRules:
    """The behaviours of one release, and the flag table its argv is read with."""

    version: str | None  # as installed or given; None: unknown (the newest rules)
    table_version: str  # the release whose flag table is used
    passthrough_unknown: bool  # newer than every table: flags it lacks pass through
    auto_sizing: bool
    check_divides_by_ranks: bool
    buffer_only_mode: bool
    hybrid_split: bool
    gated_launch: bool
    yaml_any_spelling: bool

    @property
    def describe(self) -> str:
        """One line for reports: whose rules apply."""
        if self.version is None:
            return f"SGLang version unknown: the rules of {self.table_version}"
        if self.version == self.table_version:
            return f"SGLang {self.version}"
        return f"SGLang {self.version}: the rules of {self.table_version}"

    def cli(self) -> CliRules:
        return CliRules(
            table_for(self.table_version), self.passthrough_unknown, self.yaml_any_spelling
        )


def _has(behaviour: str, version: Version) -> bool:
    return version >= parse_version(BEHAVIOURS[behaviour])


def rules_for_version(version: str | None) -> SglangRules:
    """SGLang's rules for a release; None (unknown) gets the newest.

    Raises:
        VersionError: `version` is not a version number.
    """
    newest = parse_version(sglang_cli_data.NEWEST)
    parsed = parse_version(version) if version is not None else newest
    known = [v for v in sglang_cli_data.VERSIONS if parse_version(v) <= parsed]
    table_version = known[-1] if known else sglang_cli_data.VERSIONS[0]
    return SglangRules(
        version=version,
        table_version=table_version,
        passthrough_unknown=parsed > newest or not known,
        auto_sizing=_has("auto_sizing", parsed),
        check_divides_by_ranks=_has("divided_host_check", parsed),
        buffer_only_mode=_has("buffer_only_mode", parsed),
        hybrid_split=_has("hybrid_split", parsed),
        gated_launch=_has("gated_launch", parsed),
        yaml_any_spelling=_has("yaml_any_spelling", parsed),
    )


def _entries(text: str) -> list[str]:
    return text.replace(",\n", ",").split()


@functools.cache
def table_for(version: str) -> CliTable:
    """The flag table of a release listed in sglang_cli_data.VERSIONS."""
    if version == sglang_cli_data.NEWEST:
        flags = {f.names[0]: f for f in map(CliFlag.decode, _entries(sglang_cli_data.FLAGS))}
        return CliTable(version, tuple(flags.values()))
    versions = sglang_cli_data.VERSIONS
    newer = table_for(versions[versions.index(version) + 1])
    lacks, differs = sglang_cli_history.CHANGES[version]
    flags = {f.names[0]: f for f in newer.flags if f.names[0] not in set(_entries(lacks))}
    flags.update({f.names[0]: f for f in map(CliFlag.decode, _entries(differs))})
    return CliTable(version, tuple(flags.values()))
