"""scripts/contract when a wheel cannot be fetched: one line, and a skip (exit 0) on one's own
machine but a failure (exit 1) under CI=true. No network: pip is pointed at an empty folder."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "contract"


def _script() -> ModuleType:
    loader = SourceFileLoader("contract_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader("contract_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_an_unfetched_wheel_fails_under_ci_and_skips_elsewhere():
    unfetched = _script().unfetched
    why = {"0.5.99": "ERROR: No matching distribution found for sglang==0.5.99"}
    rc, line = unfetched(why, ci=True)
    assert rc == 1
    assert line.startswith("contract: failed: CI=true")
    assert "0.5.99" in line
    rc, line = unfetched(why, ci=False)
    assert rc == 0
    assert line.startswith("contract: skipped")
    assert "No matching distribution" in line
    assert "\n" not in line


@pytest.mark.parametrize(("ci", "rc", "word"), [("true", 1, "failed"), ("", 0, "skipped")])
def test_the_script_without_a_registry(tmp_path: Path, ci: str, rc: int, word: str):
    env = {**os.environ, "CI": ci, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "0.5.99"],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert done.returncode == rc, done
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith(f"contract: {word}"), lines
    assert "sglang==0.5.99" in lines[0], lines
