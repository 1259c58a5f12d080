"""Each regex of the measured path reads, from every format string that prints its line in the
release, the numbers SGLang formats there (tests/contract/measured_lines.py); a changed word of
any regex makes it fail."""

from __future__ import annotations

import dataclasses
import re

import pytest

from supervisor.core import measured
from tests.contract.conftest import source_of
from tests.contract.measured_lines import BINDINGS, Binding, Reader, problems, readers, words

READERS, UNNAMED = readers(measured)
BY_NAME = {reader.name: reader for reader in READERS}


def _mutants(reader: Reader) -> list[Reader]:
    """The reader with one of its literal words changed (a letter added), one per word."""
    out = []
    for field in ("phrase", "pattern"):
        text = getattr(reader, field)
        for start, end in words(text):
            changed = text[:start] + text[start:end] + "q" + text[end:]
            out.append(dataclasses.replace(reader, **{field: changed}))
    return out


def test_every_regex_core_measured_exports_has_a_name_and_a_binding():
    """So a regex added to the measured path cannot escape the contract."""
    assert not UNNAMED, UNNAMED
    assert sorted(BY_NAME) == sorted(b.name for b in BINDINGS)
    for binding in BINDINGS:
        groups = re.compile(BY_NAME[binding.name].pattern).groups
        assert groups == len(binding.groups), binding


def test_every_regex_sizing_log_applies_is_an_exported_one():
    log = measured.SizingLog()
    applied = [p.pattern for p in _patterns(vars(log))]
    assert applied, "SizingLog compiles its patterns elsewhere: find them for this test"
    exported = {r.pattern for r in READERS}
    assert set(applied) <= exported, set(applied) - exported


def _patterns(value: object) -> list[re.Pattern[str]]:
    if isinstance(value, re.Pattern):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [p for item in value for p in _patterns(item)]
    return []


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: b.name)
def test_the_regex_reads_what_each_printing_format_of_the_release_puts_there(
    version: str, binding: Binding
):
    root = source_of(version)
    assert problems(BY_NAME[binding.name], binding, root) == []


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: b.name)
def test_a_changed_word_of_the_regex_fails_the_contract(version: str, binding: Binding):
    root = source_of(version)
    mutants = _mutants(BY_NAME[binding.name])
    assert mutants
    passing = [m for m in mutants if not problems(m, binding, root)]
    assert not passing, f"the contract does not see these changes: {passing}"


@pytest.mark.parametrize(
    "binding", [b for b in BINDINGS if len(b.groups) > 1], ids=lambda b: b.name
)
def test_groups_read_in_the_wrong_order_fail_the_contract(version: str, binding: Binding):
    swapped = dataclasses.replace(binding, groups=binding.groups[::-1])
    assert problems(BY_NAME[binding.name], swapped, source_of(version))
