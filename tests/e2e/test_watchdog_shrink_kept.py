"""A supervisor killed between its watchdog's SIGTERM and the death's classification: the
smaller --hicache-size was written before the signal, and the next supervisor on the same state
directory launches with it."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.run_support import supervisor

pytestmark = pytest.mark.slow

HICACHE = ("--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "4")
# The pre-flight plans on a host of 1000 GB (the 4 GB pools are simulated: 64 KiB each).
HOST = {"host": {"mem_available": "1000GB"}}


def _watchdog(warn: str, terminate: str, kill: str, grace: str = "5s") -> dict[str, Any]:
    percents = {f"{level}_percent": 0.0 for level in ("warn", "terminate", "kill")}
    levels = {"warn": warn, "terminate": terminate, "kill": kill}
    return {"watchdog": {"enabled": True, **levels, **percents, "terminate_grace": grace}}


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_supervisor_killed_right_after_its_watchdog_s_sigterm_still_relaunches_smaller(
    tmp_path: Path, free_port: int, simulated_process_guard: str
):
    # Serving, the operator reloads a terminate level no machine meets (the kill level none
    # reaches): the watchdog sends SIGTERM at its next tick. The server ignores it, so the grace
    # (60 s) holds the death's classification off until the supervisor is gone.
    quiet = {**HOST, **_watchdog("3MiB", "2MiB", "1MiB", grace="60s")}
    scenario = {"startup_s": 0.1, "ignore_sigterm": True}
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario=scenario,
        server_args=HICACHE,
        overrides=quiet,
    ) as first:
        assert _flag(first.wait_event("launching")["argv"], "--hicache-size") == "4"
        first.wait_event("ready")
        (config,) = tmp_path.glob("run-*.toml")
        text = config.read_text()
        for old, new in (('"3MiB"', '"300TB"'), ('"2MiB"', '"200TB"')):
            assert old in text
            text = text.replace(old, new)
        config.write_text(text)
        first.signal(signal.SIGHUP)
        first.wait_event("watchdog_limits_reloaded")
        first.wait_event("server_terminated")
        first.signal(signal.SIGKILL)
        assert first.wait_exit() == -signal.SIGKILL
        assert not first.events("server_failed")  # never classified
        state = first.state()
        assert state["hicache_size_override_gb"] == 3
        assert "4 -> 3" in state["override_reason"]
        saved = first.events("hicache_shrink_saved")
        assert [(e["previous_gb"], e["hicache_size_gb"]) for e in saved] == [(4, 3)]

    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"startup_s": 0.1},
        server_args=HICACHE,
        overrides=quiet,
    ) as again:
        launch = again.wait_event("launching")
        assert _flag(launch["argv"], "--hicache-size") == "3"
        assert again.wait_event("hicache_override_applied")["hicache_size_gb"] == 3
        again.wait_event("ready")
        again.signal(signal.SIGTERM)
        assert again.wait_exit() == 0
