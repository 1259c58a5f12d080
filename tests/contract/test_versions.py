"""The version table (core/sglang_versions.py BEHAVIOURS) agrees with each release's source."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.core import fit
from supervisor.core.sglang_versions import BEHAVIOURS, rules_for_version, table_for
from tests.contract.conftest import source_of
from tests.contract.sglang_text import source


def _defines(name: str) -> Callable[[Path, str], bool]:
    def check(srt: Path, _version: str) -> bool:
        return bool(source(srt).files_containing(f"def {name}("))

    return check


def _buffer_only(srt: Path, version: str) -> bool:
    flag = table_for(version).flag("--hicache-host-memory-mode")
    return flag is not None and flag.choices is not None and "buffer_only" in flag.choices


def _gated_launch(_srt: Path, version: str) -> bool:
    return table_for(version).flag("--gated-launch-port") is not None


def _yaml_any_spelling(srt: Path, _version: str) -> bool:
    parser = srt / "utils" / "server_args_config_parser.py"
    return parser.is_file() and "def _config_keys(" in parser.read_text(encoding="utf-8")


# What shows each behaviour in a release's source.
MARKERS: dict[str, Callable[[Path, str], bool]] = {
    # pool_host/base.py host_memory_budget_bytes divides by ranks_per_host()
    "divided_host_check": _defines("ranks_per_host"),
    "auto_sizing": lambda srt, _v: (srt / "mem_cache" / "hicache_auto_size.py").is_file(),
    "buffer_only_mode": _buffer_only,
    "hybrid_split": _defines("_split_hicache_size"),
    "gated_launch": _gated_launch,
    "yaml_any_spelling": _yaml_any_spelling,
}


def test_every_behaviour_has_a_marker():
    assert set(MARKERS) == set(BEHAVIOURS)


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_the_table_says_what_the_release_has(version: str, behaviour: str):
    srt = source_of(version) / "srt"
    has = MARKERS[behaviour](srt, version)
    rules = rules_for_version(version)
    field = {"divided_host_check": "check_divides_by_ranks"}.get(behaviour, behaviour)
    assert getattr(rules, field) == has, f"SGLang {version}: {behaviour} is {has} in its source"


def test_the_default_ratios_are_sglang_s(version: str):
    """`1.2 if ... == "buffer_only" else 2.0` (arg_groups/hicache_hook.py): the pre-flight's."""
    if not rules_for_version(version).buffer_only_mode:
        pytest.skip(f"SGLang {version} has no buffer_only mode")
    buffer_only, cache = fit.DEFAULT_RATIO_BUFFER_ONLY, fit.DEFAULT_RATIO_CACHE
    rule = re.compile(rf"{buffer_only!r} if [^\n]*\"buffer_only\"[^\n]* else {cache!r}")
    tree = source(source_of(version) / "srt")
    assert any(rule.search(tree.text(p)) for p in tree.files_containing("buffer_only"))
