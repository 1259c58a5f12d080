"""Which release's rules and flag table apply, from the version installed or given."""

from __future__ import annotations

import pytest

from supervisor.core import sglang_cli_data
from supervisor.core.sglang_versions import (
    VersionError,
    parse_version,
    rules_for_version,
    table_for,
)


@pytest.mark.parametrize(
    ("version", "auto", "divided", "buffer_only"),
    [
        ("0.5.18", False, False, False),
        ("0.5.19", False, True, True),
        ("0.5.20", False, True, True),
        ("0.5.21", True, True, True),
        ("0.5.23", True, True, True),
        (None, True, True, True),
    ],
)
def test_behaviours_follow_the_release(version, auto, divided, buffer_only):
    rules = rules_for_version(version)
    assert rules.auto_sizing == auto
    assert rules.check_divides_by_ranks == divided
    assert rules.buffer_only_mode == buffer_only


def test_a_post_release_uses_its_release_s_table():
    rules = rules_for_version("0.5.20.post1")
    assert rules.table_version == "0.5.20"
    assert not rules.passthrough_unknown
    assert rules.describe == "SGLang 0.5.20.post1: the rules of 0.5.20"


def test_a_newer_release_gets_the_newest_table_and_passes_unknown_flags_on():
    rules = rules_for_version("0.6.1")
    assert rules.table_version == sglang_cli_data.NEWEST
    assert rules.passthrough_unknown
    assert rules.cli().passthrough_unknown


def test_an_unknown_version_gets_the_newest_rules_and_says_so():
    rules = rules_for_version(None)
    assert rules.table_version == sglang_cli_data.NEWEST
    assert not rules.passthrough_unknown
    assert "unknown" in rules.describe


@pytest.mark.parametrize("text", ["banana", "", "0.x", "5"])
def test_what_is_not_a_version_is_refused(text):
    with pytest.raises(VersionError, match="not an SGLang version"):
        parse_version(text)


def test_older_tables_lack_the_flags_their_release_lacked():
    assert table_for("0.5.20").flag("--hicache-host-memory-fraction") is None
    assert table_for("0.5.21").flag("--hicache-host-memory-fraction") is not None
    assert table_for("0.5.18").flag("--gated-launch-port") is None
