"""SGLang's own `--config FILE.yaml`: read as SGLang reads it, and refused when it cannot be."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.adapters.sglang_config import load_sglang_config
from supervisor.errors import ConfigError


def test_the_yaml_mapping_is_read(tmp_path: Path) -> None:
    path = tmp_path / "flags.yaml"
    path.write_text("tp-size: 8\nenable-hierarchical-cache: true\n")
    data = load_sglang_config(["--model-path", "m", "--config", str(path)])
    assert data == {"tp-size": 8, "enable-hierarchical-cache": True}


@pytest.mark.timeout(10)  # a regression blocks in open() on the FIFO: fail, never hang
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_config_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "flags.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(ConfigError, match=f"--config {path}: not a regular file"):
        load_sglang_config(["--config", str(path)])


def test_a_missing_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Config file not found"):
        load_sglang_config(["--config", str(tmp_path / "absent.yaml")])


def test_anchors_and_merge_keys_within_the_budget_are_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "flags.yaml"
    path.write_text("base: &b {tp-size: 8}\nmerged:\n  <<: *b\n  page-size: 16\nlist: [*b, *b]\n")
    data = load_sglang_config(["--config", str(path)])
    assert data is not None
    assert data["merged"] == {"tp-size": 8, "page-size": 16}
    assert data["list"] == [{"tp-size": 8}, {"tp-size": 8}]


def test_an_expansion_just_within_the_budget_is_read(tmp_path: Path) -> None:
    """10 aliases of a 999-item list: 9,991 nodes expanded, under 10,000."""
    path = tmp_path / "flags.yaml"
    items = ", ".join(["1"] * 998)
    path.write_text(f"a: &a [{items}]\nb: [{', '.join(['*a'] * 9)}]\n")
    data = load_sglang_config(["--config", str(path)])
    assert data is not None
    assert len(data["b"]) == 9


def test_an_expansion_just_past_the_budget_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flags.yaml"
    items = ", ".join(["1"] * 1200)
    path.write_text(f"a: &a [{items}]\nb: [{', '.join(['*a'] * 9)}]\n")
    with pytest.raises(ConfigError, match="expand to more than 10,000 nodes"):
        load_sglang_config(["--config", str(path)])
