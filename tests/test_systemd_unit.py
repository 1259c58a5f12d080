"""The shipped systemd unit: installed by scripts/install-systemd.sh, passes systemd-analyze
verify (where the tool exists), and its stop timeout leaves room for the default stop grace."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "sglang-supervisor@.service"


def _install(tmp_path: Path) -> Path:
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "sglang-supervisor").exists():
        pytest.skip("the package is not installed in this interpreter's environment")
    result = subprocess.run(
        [str(ROOT / "scripts" / "install-systemd.sh"), "--venv", str(venv), "--name", "t1"],
        env={**os.environ, "DESTDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tmp_path / "etc" / "systemd" / "system" / "sglang-supervisor@.service"


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign] # keys are case-sensitive
    parser.read(path)
    return parser


def test_install_points_execstart_at_the_venv_and_writes_a_loadable_config(tmp_path):
    unit = _install(tmp_path)
    service = _unit(unit)["Service"]
    exe = service["ExecStart"].split()[0]
    assert Path(exe).name == "sglang-supervisor"
    assert os.access(exe, os.X_OK)
    config = tmp_path / "etc" / "sglang-supervisor" / "t1.toml"
    assert load_config(config).run.name == "example"


def test_unit_has_the_directives_the_supervisor_relies_on():
    service = _unit(UNIT)["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    assert service["LimitMEMLOCK"] == "infinity"
    assert int(service["OOMScoreAdjust"]) < 0
    assert set(service["RestartPreventExitStatus"].split()) == {"1", "2", "3", "6"}
    stop_timeout_s = int(service["TimeoutStopSec"])
    assert service["Environment"] == f"SGLANG_SUPERVISOR_STOP_TIMEOUT_S={stop_timeout_s}"
    assert stop_timeout_s >= RunConfig().stop_grace_s + 30


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_installed_unit_passes_systemd_analyze_verify(tmp_path):
    unit = _install(tmp_path)
    instance = unit.with_name("sglang-supervisor@t1.service")
    shutil.copy(unit, instance)
    for path in (unit, instance):
        result = subprocess.run(
            ["systemd-analyze", "verify", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip() == "", result.stderr
