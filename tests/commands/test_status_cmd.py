"""`sglang-supervisor status`: alive or not, what it shows, and its exit codes.

A supervisor is played by this test process: a StatusPublisher writes status.json with this
process's PID and start time (so it is "alive"), or with a start time that is not ours (a
supervisor that is gone, its PID since reused).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from supervisor.adapters.status_file import STATUS_FILE, StatusPublisher
from supervisor.cli import main
from supervisor.run.state import LOCK_FILE, STATE_FILE, StateStore

METER = "Loading safetensors checkpoint shards:  45% Completed | 27/60 [00:31<00:38,  1.2s/it]"


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    code = exit_info.value.code
    return int(code) if isinstance(code, int) else 1


def status_of(tmp_path: Path, *events: dict[str, Any]) -> StatusPublisher:
    publisher = StatusPublisher(tmp_path, instance="qwen", restart_window_s=1800.0)
    publisher.flush()
    for event in events:
        publisher.feed(event)
    publisher.close()
    return publisher


LAUNCH = (
    {"event": "launching", "run_id": "r1", "argv": ["--tp", "2", "--api-key", "***"]},
    {"event": "server_launched", "pid": 4321},
    {"event": "loading"},
)


def gone(tmp_path: Path) -> None:
    """The supervisor that wrote status.json is gone: its PID now names another process."""
    data = json.loads((tmp_path / STATUS_FILE).read_text())
    data["supervisor_start_ticks"] += 1
    (tmp_path / STATUS_FILE).write_text(json.dumps(data))
    (tmp_path / LOCK_FILE).write_text(f"{data['supervisor_pid']}\n")


def test_a_ready_supervisor_exits_0_with_its_pids_and_argv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    status_of(tmp_path, *LAUNCH, {"event": "warming"}, {"event": "ready"})
    assert run_cli(["status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("qwen: running, ready for ")
    assert f"pid {os.getpid()}" in out
    assert "pid 4321, run r1" in out
    assert "--tp 2 --api-key ***" in out
    assert "last load" in out


def test_a_loading_supervisor_exits_4_with_the_loads_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    status_of(tmp_path, *LAUNCH, {"event": "server_output", "line": METER})
    assert run_cli(["status", "--state-dir", str(tmp_path)]) == 4
    out = capsys.readouterr().out
    assert "running, loading for" in out
    assert "progress" in out
    assert "loading weights 45% (27/60 shards" in out
    assert run_cli(["status", "--state-dir", str(tmp_path), "--json"]) == 4
    shown = json.loads(capsys.readouterr().out)
    assert (shown["running"], shown["state"], shown["server_pid"]) == (True, "loading", 4321)
    progress = shown["load_progress"]
    assert (progress["phase"], progress["done"], progress["total"]) == ("weights", 27, 60)
    assert progress["description"].startswith("loading weights 45%")


def test_a_status_left_by_a_dead_supervisor_is_not_running_with_its_last_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    status_of(tmp_path, *LAUNCH, {"event": "ready"})
    gone(tmp_path)
    assert run_cli(["status", "--state-dir", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert out.startswith("qwen: not running (last known state: ready since ")
    assert run_cli(["status", "--state-dir", str(tmp_path), "--json"]) == 3
    shown = json.loads(capsys.readouterr().out)
    assert (shown["running"], shown["state"], shown["supervisor_pid"]) == (False, "ready", None)


def test_a_newer_supervisor_that_has_not_published_yet_is_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    status_of(tmp_path, *LAUNCH, {"event": "ready"})
    gone(tmp_path)
    (tmp_path / LOCK_FILE).unlink()
    store = StateStore(tmp_path)
    store.claim()  # this process: a PID other than the one in status.json... and the lock
    data = json.loads((tmp_path / STATUS_FILE).read_text())
    data["supervisor_pid"] = os.getpid() + 1_000_000  # the old supervisor's PID
    (tmp_path / STATUS_FILE).write_text(json.dumps(data))
    try:
        assert run_cli(["status", "--state-dir", str(tmp_path), "--json"]) == 4
    finally:
        store.release()
    shown = json.loads(capsys.readouterr().out)
    assert (shown["running"], shown["supervisor_pid"], shown["state"]) == (True, os.getpid(), None)
    assert "has not published its status yet" in shown["problem"]


def test_a_corrupt_status_file_is_named_and_liveness_comes_from_the_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    (tmp_path / STATUS_FILE).write_text('{"version": 1, "state": "rea')
    assert run_cli(["status", "--state-dir", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "not running" in out
    assert "status.json is corrupt" in out
    store = StateStore(tmp_path)
    store.claim()
    try:
        assert run_cli(["status", "--state-dir", str(tmp_path), "--json"]) == 4
    finally:
        store.release()
    shown = json.loads(capsys.readouterr().out)
    assert shown["running"] is True
    assert "is corrupt" in shown["problem"]


def test_a_fifo_for_a_status_file_is_told_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    os.mkfifo(tmp_path / STATUS_FILE)
    assert run_cli(["status", "--state-dir", str(tmp_path)]) == 3
    assert "not a regular file" in capsys.readouterr().out


def test_the_last_five_incidents_newest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    status_of(tmp_path, *LAUNCH)
    for minute in range(6):
        incident = {
            "kind": "memory_kill",
            "summary": f"tree above its budget #{minute}",
            "created_at": f"2026-01-01T10:0{minute}:00Z",
        }
        path = tmp_path / f"incident-20260101T100{minute}00Z-memory_kill-x{minute}.json"
        path.write_text(json.dumps(incident))
    (tmp_path / "incident-20260101T100700Z-gpu_unrecoverable-y.json").write_text("{not json")
    assert run_cli(["status", "--state-dir", str(tmp_path), "--json"]) == 4
    incidents = json.loads(capsys.readouterr().out)["incidents"]
    assert len(incidents) == 5
    assert "unreadable" in incidents[0]["problem"]
    assert [i["summary"] for i in incidents[1:]] == [
        f"tree above its budget #{m}" for m in (5, 4, 3, 2)
    ]
    run_cli(["status", "--state-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "2026-01-01T10:05:00Z  memory_kill  tree above its budget #5" in out


def test_what_state_json_keeps_is_shown_when_the_supervisor_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    state = {
        "instance": "qwen",
        "restart_count": 3,
        "last_failure": "memory_kill",
        "last_failure_hint": "lower --hicache-size",
        "last_failure_at": 1_800_000_000.0,
        "hicache_size_override_gb": 36,
        "override_reason": "memory_kill: tree above its budget",
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    assert run_cli(["status", "--state-dir", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert out.startswith("qwen: not running\n")
    assert "36 GB, restart_smaller: memory_kill: tree above its budget" in out
    assert "memory_kill" in out
    assert "lower --hicache-size" in out


def test_a_name_that_never_ran_exits_3_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    name = f"never-{uuid.uuid4().hex[:8]}"
    assert run_cli(["status", "--name", name]) == 3
    assert f"no supervisor state for {name}" in capsys.readouterr().err
    assert run_cli(["status", "--state-dir", str(tmp_path / "empty"), "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "running": False,
        "state": None,
        "problem": f"no supervisor state in {tmp_path / 'empty'}",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "../etc"], "--name '../etc'"),
        (["--config", "/nonexistent/run.toml"], "/nonexistent/run.toml"),
        (["--bogus"], "No such option '--bogus'"),
    ],
)
def test_bad_input_exits_2_with_the_reason(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
):
    assert run_cli(["status", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_config_file_locates_the_instance(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    status_of(state_dir, *LAUNCH, {"event": "ready"})
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\nname = "qwen"\nstate_dir = "{state_dir}"\n')
    assert run_cli(["status", "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith("qwen: running, ready for ")
