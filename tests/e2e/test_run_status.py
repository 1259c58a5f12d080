"""`sglang-supervisor status` against a real `run` of the simulated server: loading (with the
shard meter's progress) -> ready -> a rank crash -> backoff -> ready -> stopped; and the status
a SIGKILLed supervisor leaves behind."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main
from tests.e2e.run_support import ROOT, supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def status(state_dir: Path) -> tuple[int, dict[str, Any]]:
    """`sglang-supervisor status --json`, run in this process (it is polled)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["status", "--state-dir", str(state_dir), "--json"])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return code, json.loads(out.getvalue())


def wait_status(
    state_dir: Path, wanted: Callable[[int, dict[str, Any]], bool], what: str
) -> tuple[int, dict[str, Any]]:
    found = wait_until(
        lambda: seen if wanted(*(seen := status(state_dir))) else None,
        timeout_s=60,
        what=f"status: {what} (last: {status(state_dir)})",
    )
    assert found is not None
    return found


def test_status_follows_loading_ready_a_rank_crash_backoff_and_ready_again(
    tmp_path, free_port, simulated_process_guard
):
    scenario = {"startup_s": 4.0, "weight_shards": 6}
    options = ("--backoff-initial", "2s", "--backoff-max", "2s")
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario=scenario,
        options=options,
        notify=True,
    ) as sup:
        state_dir = sup.state_dir
        rc, loading = wait_status(
            state_dir,
            lambda _rc, s: (
                s["state"] == "loading" and (s.get("load_progress") or {}).get("total") == 6
            ),
            "loading, with the shard meter read",
        )
        assert rc == 4
        assert loading["running"] is True
        assert loading["supervisor_pid"] == sup.proc.pid
        assert loading["load_progress"]["phase"] == "weights"
        assert loading["load_progress"]["unit"] == "shards"
        assert loading["argv"][-2:] == ["--tp", "2"]
        rc, ready = wait_status(state_dir, lambda rc, s: rc == 0, "ready")
        assert ready["state"] == "ready"
        assert ready["server_pid"] == sup.events("server_launched")[0]["pid"]
        assert ready["load_progress"]["phase"] == "ready"
        first_run = ready["run_id"]

        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        rc, backoff = wait_status(state_dir, lambda _rc, s: s["state"] == "backoff", "backoff")
        assert rc == 4
        assert backoff["last_failure"]["kind"] in ("rank_crash", "exited_unexpectedly")
        assert (backoff["restart_count"], backoff["restarts_in_window"]) == (1, 1)
        assert backoff["server_pid"] is None
        assert backoff["backoff_until"] > backoff["state_since"]
        rc, again = wait_status(
            state_dir, lambda rc, s: rc == 0 and s["run_id"] != first_run, "ready again"
        )
        assert again["restart_count"] == 1
        assert again["last_failure"] == backoff["last_failure"]

        # systemd saw the load's progress in STATUS= while it loaded.
        assert any("STATUS=loading (loading weights" in d for d in sup.received())
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    # The real command, as an operator runs it, once the supervisor is gone.
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "status", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    assert ": not running (last known state: stopped since " in done.stdout
    assert "restarts" in done.stdout


def test_a_killed_supervisor_leaves_its_last_state_and_status_says_not_running(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(tmp_path, free_port, simulated_process_guard) as sup:
        wait_status(sup.state_dir, lambda rc, _s: rc == 0, "ready")
        sup.signal(signal.SIGKILL)
        sup.wait_exit()
        rc, shown = status(sup.state_dir)
        assert rc == 3
        assert (shown["running"], shown["state"], shown["supervisor_pid"]) == (False, "ready", None)
