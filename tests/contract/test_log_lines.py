"""Every log line the supervisor reads exists in the release, worded as the supervisor expects."""

from __future__ import annotations

import pytest

from supervisor.core.log_phases import PHRASES, read_mark
from supervisor.core.sglang_versions import parse_version
from tests.contract.conftest import source_of
from tests.contract.log_lines import LINES, Line
from tests.contract.sglang_text import Template, source


def test_every_sglang_phrase_the_reader_matches_has_a_line_here():
    """So a phrase added to core/log_phases.py cannot escape the contract."""
    for phrase in PHRASES:
        if phrase.origin != "sglang":
            continue
        lines = [line for line in LINES if phrase.text in line.text.lower()]
        assert lines, f"no line in tests/contract/log_lines.py contains {phrase.text!r}"


@pytest.mark.parametrize("line", LINES, ids=lambda line: line.mark.value)
def test_the_reader_recognises_each_line(line: Line):
    marked = read_mark(line.text)
    assert marked is not None, line.text
    assert marked.mark is line.mark, line.text


@pytest.mark.parametrize("line", LINES, ids=lambda line: line.mark.value)
def test_the_release_prints_each_line(version: str, line: Line):
    release = parse_version(version)
    before = line.since is not None and release < parse_version(line.since)
    after = line.until is not None and release > parse_version(line.until)
    if before or after:  # the range is right: that release does not print it
        assert not source(source_of(version)).printing(line.text, line.anchor)
        return
    root = source_of(version)
    tree = source(root)
    by_file: dict[str, list[Template]] = {}
    for template in tree.printing(line.text, line.anchor):
        by_file.setdefault(str(template.path.relative_to(root)), []).append(template)
    assert by_file, f"SGLang {version} prints no line like {line.text!r}"
    assert sorted(by_file) == sorted(line.files), (
        f"SGLang {version} prints {line.text!r} from {sorted(by_file)}, not {sorted(line.files)}"
    )
    # The words the supervisor matches on are SGLang's own, not just holes of a template: in
    # each file that prints the line.
    for path, printers in by_file.items():
        constants = tree.constants(printers[0].path).lower()
        missing = [w for w in line.key_words if w not in constants]
        assert not missing, f"SGLang {version} {path}: {missing} not in its source of {line.text!r}"
