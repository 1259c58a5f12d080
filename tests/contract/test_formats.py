"""The contract's own machinery, on a made-up source tree (runs without any SGLang wheel): format
strings taken apart and rendered, and a measured-path binding failing where it should."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from tests.contract.measured_lines import Binding, Reader, problems
from tests.contract.sglang_formats import Hole, formats_of, sample_value

POOL = """
import logging
logger = logging.getLogger(__name__)

def report(label, n, gb, extra):
    name = f"{label} widget pool" if label is not None else "widget pool"
    logger.info(
        f"{name} {'is sized' if n else 'is empty'}. "
        f"{extra + ', ' if extra else ''}slots: {n}, size: {gb:.2f} GB"
    )
    logger.info("Reserving %s spare slots: %d slots, %.2f GB.", label, n, gb)
    logger.info("Unmatched %d %d", n)
"""
READER = Reader("SLOTS", "widget pool is sized. ", r"slots: (\d+), size: ([\d.]+) GB")
BINDING = Binding("SLOTS", ("is sized", "slots: "), ("srt/a.py", "srt/b.py"), ("n", "gb"))


def _formats(text: str) -> list[str]:
    rendered = formats_of(ast.parse(text), Path("x.py"))
    return [f.render(lambda i, hole: sample_value(i, hole, {"n": 0, "gb": 1})) for f in rendered]


def test_an_f_string_becomes_one_line_per_choice_of_its_names_and_conditions():
    lines = _formats(POOL)
    assert "w0 widget pool is sized. w1, slots: 654321, size: 51.50 GB" in lines
    assert "widget pool is sized. slots: 654321, size: 51.50 GB" in lines
    assert "widget pool is empty. slots: 654321, size: 51.50 GB" in lines


def test_a_percent_format_takes_its_arguments_and_their_conversions():
    assert "Reserving w0 spare slots: 654321 slots, 51.50 GB." in _formats(POOL)
    assert not [line for line in _formats(POOL) if line.startswith("Unmatched")]


def test_unbound_placeholders_get_values_no_bound_one_has():
    bound = {"n": 0}
    values = {sample_value(i, Hole(f"x{i}", spec), bound) for i in range(8) for spec in ("d", "")}
    assert sample_value(0, Hole("n", "d"), bound) not in values
    assert sample_value(3, Hole("gb", ".2f"), {}) == "4.25"


def _tree(tmp_path: Path, b_text: str) -> Path:
    root = tmp_path / "sglang"
    (root / "srt").mkdir(parents=True)
    (root / "srt" / "a.py").write_text(POOL)
    (root / "srt" / "b.py").write_text(b_text)
    return root


def test_a_binding_holds_when_each_printing_file_reads_right(tmp_path: Path):
    assert problems(READER, BINDING, _tree(tmp_path, POOL)) == []


def test_a_line_reworded_in_one_of_its_two_files_fails(tmp_path: Path):
    root = _tree(tmp_path, POOL.replace("slots: {n}", "slot count: {n}"))
    found = problems(READER, BINDING, root)
    assert any("printed by ['srt/a.py']" in p for p in found), found


def test_a_file_printing_the_line_with_other_numbers_fails(tmp_path: Path):
    root = _tree(tmp_path, POOL.replace("slots: {n}", "slots: {n + 1}"))
    found = problems(READER, BINDING, root)
    assert [p for p in found if p.startswith("srt/b.py")], found
    assert not [p for p in found if p.startswith("srt/a.py")], found
    root = _tree(tmp_path / "other", POOL.replace("slots: {n}, size: {gb:.2f}", "slots: {m}"))
    slots = dataclasses.replace(READER, pattern=r"slots: (\w+)")
    found = problems(slots, dataclasses.replace(BINDING, groups=("n",)), root)
    assert any(p.startswith("srt/b.py") and "none of ('n',)" in p for p in found), found


def test_a_group_of_an_optional_part_reads_nothing_where_sglang_prints_none(tmp_path: Path):
    reader = Reader("LABELLED", "", r"(?:(\w+) )?widget pool is sized\. [^:]*slots: (\d+)")
    binding = dataclasses.replace(BINDING, groups=("label", "n"))
    assert problems(reader, binding, _tree(tmp_path, POOL)) == []
    required = dataclasses.replace(
        reader, pattern=r"(\w+) widget pool is sized\. [^:]*slots: (\d+)"
    )
    assert problems(required, binding, _tree(tmp_path / "other", POOL))


def test_a_group_may_read_an_expression_spelled_differently_in_another_release(tmp_path: Path):
    reader = Reader("SPARE", "", r"Reserving (\w+) spare slots: (\d+) slots")
    binding = Binding("SPARE", ("Reserving ", " spare slots: "), ("srt/a.py",), ("label", "n"))
    root = _tree(tmp_path, "")
    renamed = _tree(tmp_path / "other", "")
    (renamed / "srt" / "a.py").write_text(POOL.replace(", label, n, gb)", ", self.label, n, gb)"))
    assert problems(reader, binding, root) == []
    assert problems(reader, binding, renamed)
    either = dataclasses.replace(binding, groups=(("self.label", "label"), "n"))
    assert problems(reader, either, root) == problems(reader, either, renamed) == []
    assert problems(reader, dataclasses.replace(either, groups=(("self.label", "x"), "n")), root)


def test_a_changed_word_or_group_order_of_the_reader_fails(tmp_path: Path):
    root = _tree(tmp_path, POOL)
    reworded = dataclasses.replace(READER, pattern=r"slot: (\d+), size: ([\d.]+) GB")
    assert problems(reworded, BINDING, root)
    assert problems(dataclasses.replace(READER, phrase="widget pool is ready. "), BINDING, root)
    assert problems(READER, dataclasses.replace(BINDING, groups=("gb", "n")), root)
    # A group that reads only part of the number is as wrong as one that reads another.
    one_digit = dataclasses.replace(READER, pattern=r"slots: (\d), size: ([\d.]+) GB")
    assert problems(one_digit, BINDING, root)
