"""adapters.psi: /proc/pressure/memory parsing, including kernels without PSI."""

from __future__ import annotations

from pathlib import Path

from supervisor.adapters.psi import parse_pressure, read_memory_pressure

TEXT = (
    "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n"
    "full avg10=4.25 avg60=1.00 avg300=0.50 total=45\n"
)


def test_some_and_full_avg10_are_read():
    p = parse_pressure(TEXT)
    assert p is not None
    assert p.some_avg10 == 12.5
    assert p.full_avg10 == 4.25


def test_old_kernels_without_full_and_garbage_are_handled():
    some_only = parse_pressure(TEXT.splitlines()[0])
    assert some_only is not None
    assert some_only.full_avg10 is None
    assert parse_pressure("") is None
    assert parse_pressure("some avg10=x") is None


def test_missing_psi_file_reads_none(tmp_path: Path):
    assert read_memory_pressure(tmp_path) is None
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "memory").write_text(TEXT)
    assert read_memory_pressure(tmp_path) is not None
