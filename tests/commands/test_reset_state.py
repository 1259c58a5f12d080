"""`sglang-supervisor reset-state`: the watchdog's override and restart history are forgotten."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.run.state import ProcessRef, RunState, StateStore


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    code = exit_info.value.code
    return int(code) if isinstance(code, int) else 1


def test_reset_state_clears_the_override_and_keeps_the_pids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    store = StateStore(tmp_path)
    store.ensure_writable()
    store.save(
        RunState(
            instance="demo",
            restart_count=3,
            restart_times=(1_800_000_000.0, 1_800_000_060.0),
            last_failure="memory_kill",
            hicache_size_override_gb=30,
            override_reason="memory kill: --hicache-size 40 -> 30 GB",
            server_pids=(ProcessRef(pid=123, start_ticks=5, title="x"),),
        )
    )
    assert run_cli(["reset-state", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cleared --hicache-size override 30 GB" in out
    after = store.load()
    assert after.hicache_size_override_gb is None
    assert after.override_reason is None
    assert after.restart_count == 0
    assert after.restart_times == ()  # the next supervisor starts with the whole budget
    assert after.last_failure is None
    assert after.server_pids == (ProcessRef(pid=123, start_ticks=5, title="x"),)


def test_reset_state_finds_the_directory_through_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    config = tmp_path / "c.toml"
    config.write_text(f'[run]\nstate_dir = "{tmp_path / "st"}"\n')
    (tmp_path / "st").mkdir()  # the instance ran once
    assert run_cli(["reset-state", "--config", str(config)]) == 0
    assert "no --hicache-size override was set" in capsys.readouterr().out
    assert (tmp_path / "st" / "state.json").is_file()


def test_a_state_directory_that_cannot_be_made_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert run_cli(["reset-state", "--state-dir", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"{blocker} on its path is a regular file, not a directory" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["a/b", ".", "..", "...", "../x", ""])
def test_a_name_that_is_not_a_plain_instance_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
):
    monkeypatch.setattr("supervisor.config.sections.STATE_ROOT", tmp_path / "root")
    monkeypatch.setattr("supervisor.run.state.STATE_ROOT", tmp_path / "root")
    assert run_cli(["reset-state", "--name", name]) == 2
    err = capsys.readouterr().err
    assert "--name" in err
    assert "letters, digits" in err
    assert "Traceback" not in err
    assert not (tmp_path / "root").exists()


def test_a_plain_name_finds_its_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("supervisor.run.state.STATE_ROOT", tmp_path)
    (tmp_path / "qwen-3.5@b_1").mkdir()
    assert run_cli(["reset-state", "--name", "qwen-3.5@b_1"]) == 0
    assert (tmp_path / "qwen-3.5@b_1" / "state.json").is_file()


HOLDER = """
import sys
from pathlib import Path
from supervisor.run.state import StateStore
store = StateStore(Path(sys.argv[1]))
store.ensure_writable()
store.claim()
print("held", flush=True)
sys.stdin.read()  # hold the lock until the test closes our stdin
"""


def test_reset_state_refuses_while_a_live_supervisor_holds_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    store = StateStore(tmp_path)
    store.ensure_writable()
    store.save(RunState(instance="demo", restart_count=2, hicache_size_override_gb=30))
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdin is not None
        assert holder.stdout is not None
        try:
            assert holder.stdout.readline() == "held\n"  # the lock is taken: no sleep needed
            assert run_cli(["reset-state", "--state-dir", str(tmp_path)]) == 2
            err = capsys.readouterr().err
            assert f"another sglang-supervisor (pid {holder.pid})" in err
            assert store.load().hicache_size_override_gb == 30  # untouched
        finally:
            holder.stdin.close()  # the holder's read ends, and with it the process and its lock
            holder.wait(timeout=30)
    assert run_cli(["reset-state", "--state-dir", str(tmp_path)]) == 0  # the lock went with it
    assert store.load().hicache_size_override_gb is None
    assert run_cli(["reset-state", "--state-dir", str(tmp_path)]) == 0  # and reset-state's too


@pytest.mark.parametrize("mode", [0o777, 0o757])
def test_reset_state_refuses_a_directory_others_can_write_naming_its_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: int
):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state_dir.chmod(mode)
    assert run_cli(["reset-state", "--state-dir", str(state_dir)]) == 2
    err = capsys.readouterr().err
    assert f"state directory {state_dir} is owned by " in err
    assert f"mode {mode:04o}: writable by its group or by others" in err
    assert list(state_dir.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_reset_state_refuses_another_users_directory_naming_the_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    os.chown(state_dir, 65534, -1)
    assert run_cli(["reset-state", "--state-dir", str(state_dir)]) == 2
    assert "(uid 65534), mode 0755" in capsys.readouterr().err


def test_reset_state_refuses_a_link_planted_at_the_lock_and_leaves_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "supervisor.lock").symlink_to(target)
    assert run_cli(["reset-state", "--state-dir", str(state_dir)]) == 2
    assert "supervisor.lock is a symbolic link" in capsys.readouterr().err
    assert target.read_text() == "keep me\n"
