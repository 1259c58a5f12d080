"""`check-config FILE` and `run --dry-run`: every check `run` makes before it starts, the argv
it would launch (override and auto-size applied, secrets masked), and nothing started, killed or
written; and the SGLANG_SUPERVISOR_<OPTION> variables between the command line and the file."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from supervisor import log as sup_log
from supervisor.cli import main
from supervisor.run.state import RunState

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "configs" / "models" / "llama-3-70b" / "config.json"
ARGS = '["--model-path", "m", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "40"]'


@pytest.fixture(autouse=True)
def _logging_as_it_was(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The commands configure the process's logging: leave it as found for the next test."""
    monkeypatch.setattr(sup_log, "_format", sup_log.configured_format())
    yield
    structlog.reset_defaults()
    sup_log.register_secrets(())


def write_config(tmp_path: Path, extra: str = "", args: str = ARGS, run: str = "") -> Path:
    """Planning facts only (no /proc, no GPU): 445 GB and eight 141 GiB GPUs."""
    path = tmp_path / "run.toml"
    path.write_text(
        f"[server]\nargs = {args}\nmodel_config = {json.dumps(str(LLAMA))}\n"
        'env = { HF_TOKEN = "hf_check_config_secret", HF_HOME = "/data/hf" }\n'
        '[host]\nmem_available = "445GB"\ngpus = 8\ngpu_memory = "141GiB"\n'
        'sglang_version = "0.5.23"\n'
        f'[preflight]\nweights = "40GB"\nledger_dir = "{tmp_path / "ledger"}"\n'
        f'[run]\nname = "check"\nstate_dir = "{tmp_path / "state"}"\n{run}'
        '[gpu]\nbackend = "none"\n' + extra
    )
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert isinstance(exc.value.code, int)
    return exc.value.code, out, err


def dry_run(capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, Any, str]:
    code, out, err = cli(capsys, "run", "--log-format", "json", "--dry-run", *options)
    return code, json.loads(out) if code == 0 else None, err


# -- check-config ----------------------------------------------------------------------------


def test_a_good_config_passes_with_its_launch_and_nothing_is_written(tmp_path, capsys):
    config = write_config(tmp_path)
    code, out, _err = cli(capsys, "check-config", str(config), "--json")
    assert code == 0
    view = json.loads(out)
    assert view["ok"] is True
    assert view["preflight"]["verdict"] == "fit"
    assert view["argv"][-2:] == ["--hicache-size", "40"]
    assert view["environment"]["added"]["HF_TOKEN"] == "***"
    assert "hf_check_config_secret" not in out
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "ledger").exists()
    code, text, _err = cli(capsys, "check-config", str(config))
    assert code == 0
    assert f"{config}: valid" in text
    assert "health      GET http://127.0.0.1:30000/health every 10 s" in text


def test_a_launch_that_does_not_fit_exits_1(tmp_path, capsys):
    config = write_config(tmp_path, args=ARGS.replace('"40"', '"400"'))
    code, _out, err = cli(capsys, "check-config", str(config))
    assert code == 1
    assert "the pre-flight refuses this launch" in err


@pytest.mark.parametrize(
    ("extra", "args", "message"),
    [
        ("[server_extra]\nbogus = 1\n", ARGS, "unknown config section [server_extra]"),
        ('[hooks]\non_ready = "notify {instnace}"\n', ARGS, "unknown placeholder {instnace}"),
        ('[hooks]\non_fatal = "no-such-pager-xyz {kind}"\n', ARGS, "hooks.on_fatal"),
        ('[gpu]\nreset_command = "/no/such/reset {index}"\n', ARGS, "reset_command"),
        ("", '["--model-path", "m", "--tp-size", "two"]', "invalid int value"),  # SGLang's
    ],
)
def test_a_bad_config_exits_2_naming_what_is_wrong(tmp_path, capsys, extra, args, message):
    config = write_config(tmp_path, extra.replace("[gpu]\n", ""), args=args)
    code, _out, err = cli(capsys, "check-config", str(config))
    assert code == 2
    assert message in err
    assert not (tmp_path / "state").exists()


def test_a_missing_config_file_exits_2(tmp_path, capsys):
    code, _out, err = cli(capsys, "check-config", str(tmp_path / "nope.toml"))
    assert code == 2
    assert "nope.toml" in err


# -- run --dry-run -----------------------------------------------------------------------------


def test_a_dry_run_shows_the_override_and_masks_secrets_and_starts_nothing(tmp_path, capsys):
    config = write_config(tmp_path, '[watchdog]\nshrink_expires = "24h"\n')
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state = RunState(
        hicache_size_override_gb=30, override_reason="memory kill", override_set_at=4e9
    )
    (state_dir / "state.json").write_text(json.dumps(state.to_json()))
    before = (state_dir / "state.json").read_bytes()
    marker = tmp_path / "launched"
    server = tmp_path / "server.sh"
    server.write_text(f"#!/bin/sh\ntouch {marker}\n")
    server.chmod(0o755)
    code, view, _err = dry_run(
        capsys,
        "--config",
        str(config),
        "--server-command",
        str(server),
        "--",
        *json.loads(ARGS),
        "--api-key",
        "sk-dry-run-secret",
    )
    assert code == 0
    assert view["argv"][-4:] == ["--hicache-size", "30", "--api-key", "***"]
    assert view["override"]["since"] == "2096-10-02T07:06:40Z"
    assert view["override"]["expires"] == "2096-10-03T07:06:40Z"
    assert view["environment"]["added"] == {
        "HF_HOME": "/data/hf",
        "HF_TOKEN": "***",
        "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
        "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    }
    assert view["environment"]["inherited"] > 0
    assert view["limits"]["watchdog"]["tree_budget_bytes"] > 0
    assert view["limits"]["restarts"]["max_restarts"] == 5
    assert not marker.exists()  # nothing launched
    assert (state_dir / "state.json").read_bytes() == before  # nothing written
    assert sorted(p.name for p in state_dir.iterdir()) == ["state.json"]  # no lock taken


def test_a_dry_run_drops_an_expired_override_without_writing(tmp_path, capsys):
    config = write_config(tmp_path, '[watchdog]\nshrink_expires = "1h"\n')
    (tmp_path / "state").mkdir()
    expired = RunState(hicache_size_override_gb=30, override_set_at=1.0)
    (tmp_path / "state" / "state.json").write_text(json.dumps(expired.to_json()))
    code, view, _err = dry_run(capsys, "--config", str(config))
    assert code == 0
    assert view["argv"][-2:] == ["--hicache-size", "40"]
    assert "expired" in view["state_note"]
    saved = json.loads((tmp_path / "state" / "state.json").read_text())
    assert saved["hicache_size_override_gb"] == 30


def test_a_dry_run_refused_by_the_pre_flight_exits_1_and_keeps_a_damaged_state(tmp_path, capsys):
    config = write_config(tmp_path, args=ARGS.replace('"40"', '"400"'))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "state.json").write_text("{not json")
    code, _view, err = dry_run(capsys, "--config", str(config))
    assert code == 1
    assert "the pre-flight refuses this launch" in err
    assert (tmp_path / "state" / "state.json").read_text() == "{not json"  # not set aside
    code, view, _err = dry_run(capsys, "--config", str(config), "--auto-size")
    assert code == 0
    assert "damaged" in view["state_note"]
    assert view["argv"][-2] == "--hicache-size"
    assert int(view["argv"][-1]) < 400  # what --auto-size would launch


# -- SGLANG_SUPERVISOR_<OPTION> ----------------------------------------------------------------


def interval(capsys: pytest.CaptureFixture[str], config: Path, *options: str) -> float:
    code, view, err = dry_run(capsys, "--config", str(config), *options)
    assert code == 0, err
    value = view["limits"]["health"]["interval_s"]
    assert isinstance(value, float)
    return value


def test_command_line_beats_environment_beats_file_beats_default(tmp_path, capsys, monkeypatch):
    plain = write_config(tmp_path)
    assert interval(capsys, plain) == 10.0  # the default
    with_key = write_config(tmp_path, run='health_interval = "5s"\n')
    assert interval(capsys, with_key) == 5.0  # the file
    monkeypatch.setenv("SGLANG_SUPERVISOR_HEALTH_INTERVAL", "2s")
    assert interval(capsys, with_key) == 2.0  # the environment over the file
    assert interval(capsys, with_key, "--health-interval", "1s") == 1.0  # the command line


def test_flags_and_the_config_path_come_from_the_environment_too(tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path)
    monkeypatch.setenv("SGLANG_SUPERVISOR_CONFIG", str(config))
    monkeypatch.setenv("SGLANG_SUPERVISOR_RESTART_ON_RELOAD", "true")
    code, view, _err = dry_run(capsys)
    assert code == 0
    assert view["limits"]["restarts"]["restart_on_reload"] is True
    code, view, _err = dry_run(capsys, "--no-restart-on-reload")
    assert view["limits"]["restarts"]["restart_on_reload"] is False


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "(env var: 'SGLANG_SUPERVISOR_HEALTH_INTERVAL')"),  # not a duration
        ("0s", "from the environment variable SGLANG_SUPERVISOR_HEALTH_INTERVAL"),  # impossible
    ],
)
def test_a_bad_value_in_a_variable_exits_2_naming_it(tmp_path, capsys, monkeypatch, value, message):
    monkeypatch.setenv("SGLANG_SUPERVISOR_HEALTH_INTERVAL", value)
    code, _view, err = dry_run(capsys, "--config", str(write_config(tmp_path)))
    assert code == 2
    assert message in err


def test_a_bad_option_is_named_as_the_option(tmp_path, capsys):
    config = write_config(tmp_path)
    code, _view, err = dry_run(capsys, "--config", str(config), "--failure-threshold", "0")
    assert code == 2
    assert "run.failure_threshold must be at least 1" in err
    assert "from the option --failure-threshold" in err


def test_help_names_each_option_s_variable(capsys):
    code, out, _err = cli(capsys, "run", "--help")
    assert code == 0
    for name in ("CONFIG", "HEALTH_INTERVAL", "AUTO_SIZE", "RESTART_ON_RELOAD", "LOG_LEVEL"):
        assert f"SGLANG_SUPERVISOR_{name}" in out.replace("\n", "").replace(" ", "")
    assert sys.executable  # the help needs no server command
