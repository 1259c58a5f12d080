"""The shipped systemd unit: installed by scripts/install-systemd.sh (into a DESTDIR here), passes
systemd-analyze verify (where the tool exists), its stop timeout leaves room for the default stop
grace and its start timeout for the time before the first EXTEND_TIMEOUT_USEC. The installer
writes the instance's name into its config, refuses names `run` would refuse (and any path out of
/etc/sglang-supervisor), and says what is wrong with a bad --venv."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config import GpuConfig, RunConfig, load_config
from supervisor.config.sections import instance_name_problem
from supervisor.core.units import parse_duration

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "sglang-supervisor@.service"


VENV = Path(sys.executable).parent.parent


def _installer(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / "install-systemd.sh"), *args],
        env={**os.environ, "DESTDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _install(tmp_path: Path, name: str = "t1") -> Path:
    if not (VENV / "bin" / "sglang-supervisor").exists():
        pytest.skip("the package is not installed in this interpreter's environment")
    result = _installer(tmp_path, "--venv", str(VENV), "--name", name)
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
    # The unit passes --name t1: the file says the same, so `reset-state --config` finds it.
    assert load_config(config).run.name == "t1"
    installed_docs = tmp_path / "usr/share/doc/sglang-supervisor/docs"
    assert (installed_docs / "operating.md").read_bytes() == (
        ROOT / "docs/operating.md"
    ).read_bytes()
    assert (tmp_path / "usr/share/doc/sglang-supervisor/README.md").read_bytes() == (
        ROOT / "README.md"
    ).read_bytes()


def test_unit_has_the_directives_the_supervisor_relies_on():
    service = _unit(UNIT)["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    assert service["LimitMEMLOCK"] == "infinity"
    assert int(service["OOMScoreAdjust"]) < 0
    assert set(service["RestartPreventExitStatus"].split()) == {"1", "2", "3", "4", "6"}
    assert service["EnvironmentFile"] == "-/etc/sglang-supervisor/%i.env"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    documentation = _unit(UNIT)["Unit"]["Documentation"].split()
    assert "file:///usr/share/doc/sglang-supervisor/README.md" in documentation
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


def test_the_start_timeout_covers_the_time_before_the_first_extension():
    """From start to the first EXTEND_TIMEOUT_USEC: the interpreter, NVML's first answer (at most
    gpu.nvml_start_timeout) and the pre-flight; every later wait tick extends (run/events.py)."""
    start_timeout_s = parse_duration(_unit(UNIT)["Service"]["TimeoutStartSec"])
    assert start_timeout_s - GpuConfig().nvml_start_timeout_s >= 60


def test_the_installed_config_plans_without_the_model_on_this_host(tmp_path):
    """Exit 2 at the first start would make systemd give up: the shipped example must get past
    the model lookup on a fresh box (its model config is installed beside it)."""
    _install(tmp_path)
    config = tmp_path / "etc" / "sglang-supervisor" / "t1.toml"
    command = [str(VENV / "bin" / "sglang-supervisor"), "preflight", "--config", str(config)]
    result = subprocess.run(
        [*command, "--gpu-backend", "none", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr  # fits or not on this box: never exit 2
    report = json.loads(result.stdout)
    assert report["model"] == "Qwen/Qwen3-8B"


def test_the_installer_writes_a_private_env_file_once_and_keeps_an_existing_config(tmp_path):
    _install(tmp_path)
    conf_dir = tmp_path / "etc" / "sglang-supervisor"
    env = conf_dir / "t1.env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert "#HF_TOKEN=" in env.read_text()
    env.write_text("HF_TOKEN=hf_mine\n")
    config = conf_dir / "t1.toml"
    config.write_text(config.read_text().replace('name = "t1"', 'name = "mine"'))
    result = _installer(tmp_path, "--venv", str(VENV), "--name", "t1")
    assert result.returncode == 0, result.stderr
    assert env.read_text() == "HF_TOKEN=hf_mine\n"
    assert 'name = "mine"' in config.read_text()
    assert 'its [run] name is not "t1"' in result.stderr


@pytest.mark.parametrize("name", ["../../x", "..", "...", "a/b", "a b", "", "x;rm"])
def test_the_installer_refuses_names_run_would_refuse_and_writes_nothing(tmp_path, name):
    result = _installer(tmp_path, "--venv", str(VENV), "--name", name)
    assert result.returncode == 2
    assert "--name" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
    if name:
        problem = instance_name_problem(name)
        assert problem is not None, "the installer refused a name run accepts"


def test_the_installer_accepts_every_character_the_rule_allows(tmp_path):
    unit = _install(tmp_path, name="Qwen3-8b_v1.2@node-a")
    assert unit.exists()
    assert load_config(unit.parents[2] / "sglang-supervisor" / "Qwen3-8b_v1.2@node-a.toml")


@pytest.mark.parametrize(
    ("venv", "message"),
    [
        ("/nonexistent/venv", "--venv /nonexistent/venv: no such directory"),
        ("/", "/bin/sglang-supervisor is not executable"),
    ],
)
def test_a_bad_venv_is_named_and_nothing_is_written(tmp_path, venv, message):
    result = _installer(tmp_path, "--venv", venv)
    assert result.returncode == 2
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []
