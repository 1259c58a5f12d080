"""Messages that must be true: a damaged state file said so, --json errors as JSON, NO_COLOR,
reset-state of an instance that never ran, a group launcher's contradiction named by its
variable (docs/faults.md "Bad input")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from supervisor import log as sup_log
from tests.faults.bad_input import cli, logging_as_it_was, preflight, refused, write_config


@pytest.fixture(autouse=True)
def _logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from logging_as_it_was(monkeypatch)


# -- a damaged state.json ----------------------------------------------------------------------

DAMAGED = {
    "not JSON": "{bad json",
    "5000 levels": "[" * 5000 + "]" * 5000,
    "a list": "[1, 2]",
}


@pytest.mark.parametrize("text", DAMAGED.values(), ids=DAMAGED.keys())
def test_status_says_a_damaged_state_file_is_damaged(tmp_path, capsys, text):
    """It said "not running", "restarts 0": as if the instance had a clean history."""
    (tmp_path / "state.json").write_text(text)
    code, out, _err = cli(capsys, "status", "--state-dir", str(tmp_path))
    assert code == 3  # not running: true, and not bad input
    assert f"state file  {tmp_path / 'state.json'} is damaged" in out
    assert "restarts    unknown (the state file is damaged)" in out
    code, out, _err = cli(capsys, "status", "--state-dir", str(tmp_path), "--json")
    view = json.loads(out)
    assert view["restart_count"] is None
    assert "is damaged" in view["state_problem"]


def test_check_config_notes_a_state_file_nested_past_the_limit(tmp_path, capsys):
    config = write_config(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "state.json").write_text(DAMAGED["5000 levels"])
    code, out, err = cli(capsys, "check-config", str(config))
    assert code == 0, err
    assert "nested more than 64 levels deep" in out
    assert "run sets it aside" in out


# -- --json errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (preflight("--json", "--sglang-version", "0.4.0"), "0.4.0 is older"),
        (preflight("--json", "--gpus", "lots"), "'--gpus'"),
        (["preflight", "--json", "--config", "/nonexistent.toml"], "/nonexistent.toml"),
        (["check-config", "--json", "/nonexistent.toml"], "/nonexistent.toml"),
        (["status", "--json", "--name", "a/b"], "--name 'a/b'"),
    ],
    ids=["preflight", "preflight usage", "preflight config", "check-config", "status"],
)
def test_a_json_mode_error_is_a_json_object_on_stdout(capsys, argv, message):
    """preflight --json printed errors as text on stderr, nothing on stdout."""
    code, out, _err = cli(capsys, *argv)
    assert code == 2
    error = json.loads(out)
    assert error["ok"] is False
    assert error["exit_code"] == 2
    assert message in error["error"]


# -- NO_COLOR ----------------------------------------------------------------------------------


def console_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch, no_color: str | None) -> str:
    """One event rendered by the console renderer onto a pseudo-terminal."""
    leader, follower = os.openpty()
    try:
        if no_color is None:
            monkeypatch.delenv("NO_COLOR", raising=False)
        else:
            monkeypatch.setenv("NO_COLOR", no_color)
        with open(follower, "w", closefd=False) as terminal:
            sup_log.configure_logging("console", "info", terminal)
            structlog.get_logger("supervisor").info("ready", port=30000)
            terminal.flush()
        return os.read(leader, 65536).decode()
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize("value", ["1", "true"])
def test_no_color_turns_the_console_s_colours_off(monkeypatch, value):
    assert "\x1b[" in console_line_on_a_terminal(monkeypatch, None)  # colour on a terminal
    line = console_line_on_a_terminal(monkeypatch, value)
    assert "ready" in line
    assert "\x1b[" not in line


def test_an_empty_no_color_keeps_the_colours(monkeypatch):
    """no-color.org: set and not empty."""
    assert "\x1b[" in console_line_on_a_terminal(monkeypatch, "")


# -- reset-state -------------------------------------------------------------------------------


def test_reset_state_of_an_instance_that_never_ran_is_refused_and_creates_nothing(
    tmp_path, capsys, monkeypatch
):
    """`reset-state --name <typo>` exited 0 and created the typo's directory."""
    monkeypatch.setattr("supervisor.run.state.STATE_ROOT", tmp_path)
    err = refused(capsys, "reset-state", "--name", "qwen-typo")
    assert f"no instance has state in {tmp_path / 'qwen-typo'}" in err
    assert "--force" in err
    assert not (tmp_path / "qwen-typo").exists()
    code, _out, _err = cli(capsys, "reset-state", "--name", "qwen-typo", "--force")
    assert code == 0
    assert (tmp_path / "qwen-typo" / "state.json").is_file()


# -- group mode --------------------------------------------------------------------------------

LWS = {
    "LWS_LEADER_ADDRESS": "127.0.0.1",
    "LWS_WORKER_INDEX": "0",
    "SGLANG_SUPERVISOR_GROUP_TOKEN": "t" * 32,
}


@pytest.mark.parametrize(
    ("size", "argv", "message"),
    [
        ("2", ["--nnodes", "3", "--tp", "2"], "LWS_GROUP_SIZE=2 but --nnodes 3"),
        ("2", ["--tp", "3"], "a group of 2 nodes (LWS_GROUP_SIZE=2)"),
        ("x", ["--tp", "2"], "LWS_GROUP_SIZE='x' is not an integer"),
    ],
)
def test_a_group_contradiction_names_the_launcher_s_variable(
    tmp_path, capsys, monkeypatch, size, argv, message
):
    """LWS_GROUP_SIZE=2 with --nnodes 3 --tp 2 was exit 3, "--tp-size 2 does not divide over
    --nnodes 3", without a word of LWS."""
    for name, value in {**LWS, "LWS_GROUP_SIZE": size}.items():
        monkeypatch.setenv(name, value)
    config = write_config(tmp_path, {"server": {"args": ["--model-path", "m/x", *argv]}})
    err = refused(capsys, "run", "--log-format", "console", "--dry-run", "--config", str(config))
    assert message in err


def test_the_contradiction_waits_for_a_group(tmp_path: Path, capsys, monkeypatch):
    """Without a launcher's variables the argv's own reading stands: SGLang's exit 3."""
    for name in ("LWS_GROUP_SIZE", *LWS):
        monkeypatch.delenv(name, raising=False)
    config = write_config(tmp_path, {"server": {"args": ["--model-path", "m/x", "--nnodes", "3"]}})
    code, _out, err = cli(
        capsys, "run", "--log-format", "console", "--dry-run", "--config", str(config)
    )
    assert code == 3
    assert "does not divide over --nnodes 3" in err
