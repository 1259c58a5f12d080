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
