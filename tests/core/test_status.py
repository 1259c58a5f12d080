"""The status, folded from the supervisor's log events (core/status.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from supervisor.core.load_progress import Phase
from supervisor.core.status import (
    Status,
    fold,
    restarts_in_window,
    systemd_line,
)

T0 = 1_800_000_000.0


def begin() -> Status:
    return Status.begin(
        instance="qwen",
        supervisor_pid=4242,
        supervisor_start_ticks=99,
        restart_window_s=1800.0,
        now_s=T0,
    )


def play(status: Status, *events: tuple[float, Mapping[str, Any]]) -> Status:
    for at_s, event in events:
        status = fold(status, event, T0 + at_s)
    return status


def launch(run_id: str, argv: list[str], pid: int, at_s: float) -> list[tuple[float, Any]]:
    return [
        (at_s, {"event": "launching", "run_id": run_id, "argv": argv, "restart_count": 0}),
        (at_s, {"event": "server_launched", "pid": pid, "pgid": pid, "run_id": run_id}),
        (at_s + 1, {"event": "loading", "run_id": run_id}),
    ]


ARGV = ["--model-path", "m", "--tp", "8", "--hicache-size", "48", "--api-key", "***"]


def test_a_start_reads_as_starting_then_the_launch_and_the_load():
    status = begin()
    assert (status.state, status.state_since_s, status.server_pid) == ("starting", T0, None)
    status = play(status, *launch("r1", ARGV, 777, at_s=5))
    assert (status.state, status.state_since_s) == ("loading", T0 + 6)
    assert (status.run_id, status.server_pid, status.argv) == ("r1", 777, tuple(ARGV))
    assert status.hicache_size_gb == "48"
    assert status.load is not None
    assert status.load.started_at_s == T0 + 5
    meter = "Loading safetensors checkpoint shards:  45% Completed | 27/60 [00:31<00:38,  1.2s/it]"
    status = play(
        status,
        (7, {"event": "server_output", "line": "[TP0] Load weight begin. avail mem=93 GB"}),
        (40, {"event": "server_output", "line": meter}),
    )
    assert status.load is not None
    assert (status.load.phase, status.load.done, status.load.total) == (Phase.WEIGHTS, 27, 60)
    assert status.state_since_s == T0 + 6  # output is no state change
    status = play(status, (90, {"event": "warming"}), (95, {"event": "ready"}))
    assert (status.state, status.state_since_s) == ("ready", T0 + 95)
    assert status.load is not None
    assert (status.load.phase, status.load.phase_since_s) == (Phase.READY, T0 + 95)


def test_output_is_not_read_once_the_server_serves():
    status = play(begin(), *launch("r1", ARGV, 777, at_s=0), (5, {"event": "ready"}))
    line = {"event": "server_output", "line": "[TP0] Load weight begin. avail mem=93 GB"}
    assert fold(status, line, T0 + 6) is status


def test_a_rank_crash_backoff_gpu_wait_and_relaunch():
    status = play(begin(), *launch("r1", ARGV, 777, at_s=0), (5, {"event": "ready"}))
    status = play(
        status,
        (10, {"event": "unhealthy", "cause": "rank_missing", "restart_count": 0}),
        (10, {"event": "server_failed", "failure": "rank_crash", "hint": "see the rank's log"}),
        (11, {"event": "restarting", "failure": "rank_crash", "delay_s": 10.0, "restart_count": 1}),
    )
    assert (status.state, status.server_pid, status.backoff_until_s) == ("backoff", None, T0 + 21)
    assert status.restart_count == 1
    assert status.restart_times_s == (T0 + 11,)
    assert status.last_failure is not None
    assert (status.last_failure.kind, status.last_failure.at_s) == ("rank_crash", T0 + 10)
    status = play(status, (21, {"event": "gpu_release_waiting", "reason": "GPU 3 holds 2 GiB"}))
    assert (status.state, status.state_since_s) == ("waiting_for_gpus", T0 + 21)
    assert status.gpu_release is not None
    assert status.gpu_release.state == "waiting"
    status = play(status, (24, {"event": "gpu_release_done", "elapsed_s": 3.2, "gpus": [3]}))
    assert status.state == "backoff"
    assert status.gpu_release is not None
    assert (status.gpu_release.state, status.gpu_release.detail) == ("released", "after 3.2 s")
    status = play(status, *launch("r2", ARGV, 888, at_s=25))
    assert (status.state, status.run_id, status.server_pid) == ("loading", "r2", 888)
    assert status.load is not None
    assert status.load.phase is Phase.STARTING  # a fresh load
    assert status.last_failure is not None  # kept: the last failure, with its time


def test_the_end_of_a_run_reads_as_failed_with_its_reason():
    status = play(
        begin(),
        (3, {"event": "fatal", "exit_code": 1, "reason": "the pre-flight refuses this launch"}),
    )
    assert (status.state, status.exit_code) == ("failed", 1)
    assert status.end_reason == "the pre-flight refuses this launch"
    stopped = play(
        begin(), *launch("r1", ARGV, 7, 0), (9, {"event": "stopping"}), (10, {"event": "stopped"})
    )
    assert (stopped.state, stopped.server_pid, stopped.exit_code) == ("stopped", None, None)


def test_an_override_shows_with_the_launch_it_applies_to():
    smaller = [*ARGV[:5], "36", *ARGV[6:]]
    status = play(
        begin(),
        (
            1,
            {
                "event": "hicache_override_applied",
                "hicache_size_gb": 36,
                "reason": "memory_kill: tree above its budget",
            },
        ),
    )
    assert status.hicache_override is None  # not launched yet
    status = play(status, *launch("r1", smaller, 7, at_s=2))
    assert status.hicache_override is not None
    assert status.hicache_override.source == "restart_smaller"
    assert status.hicache_override.size_gb == 36
    assert "memory_kill" in status.hicache_override.reason
    again = play(status, *launch("r2", smaller, 8, at_s=9))  # the same argv: still in force
    assert again.hicache_override == status.hicache_override
    back = play(status, *launch("r3", ARGV, 9, at_s=20))  # reset-state, a new supervisor
    assert back.hicache_override is None


def test_an_auto_size_names_the_checks_that_failed():
    status = play(
        begin(),
        (
            1,
            {
                "event": "auto_sized",
                "hicache_size_gb": 49,
                "failed_checks": ["host memory: 2,446 GB needed, 449 GB available"],
            },
        ),
        *launch("r1", [*ARGV[:5], "49"], 7, at_s=2),
    )
    assert status.hicache_override is not None
    assert status.hicache_override.source == "auto_size"
    assert "2,446 GB needed" in status.hicache_override.reason


def test_unknown_events_and_wrong_types_change_nothing():
    status = begin()
    assert fold(status, {"event": "memory_report", "available_bytes": 1}, T0 + 1) is status
    assert fold(status, {"no": "event"}, T0 + 1) is status
    odd = fold(status, {"event": "server_launched", "pid": "not a pid"}, T0 + 1)
    assert odd is status
    odd = fold(status, {"event": "loading", "restart_count": "3"}, T0 + 1)
    assert odd.restart_count == 0


def test_the_key_changes_with_the_state_and_the_phase_not_with_counts():
    status = play(begin(), *launch("r1", ARGV, 7, at_s=0))
    first = "Loading safetensors checkpoint shards:   0% Completed | 0/8 [00:00<?, ?it/s]"
    later = "Loading safetensors checkpoint shards:  50% Completed | 4/8 [00:04<00:04,  1.0it/s]"
    weights = fold(status, {"event": "server_output", "line": first}, T0 + 2)
    assert weights.key() != status.key()
    assert fold(weights, {"event": "server_output", "line": later}, T0 + 6).key() == weights.key()


def test_the_status_survives_its_json():
    status = play(
        begin(),
        *launch("r1", ARGV, 7, at_s=0),
        (1, {"event": "server_failed", "failure": "rank_crash", "hint": "h"}),
        (2, {"event": "restarting", "delay_s": 1.0, "restart_count": 1}),
        (3, {"event": "gpu_release_waiting", "reason": "busy"}),
    )
    data = status.to_json()
    assert data["state"] == "waiting_for_gpus"
    assert data["last_failure"] == {"kind": "rank_crash", "hint": "h", "at": T0 + 1}
    assert Status.from_json(data) == status


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"version": 9}, ValueError),
        ({"supervisor_pid": "42"}, TypeError),
        ({"argv": None}, TypeError),
        ({"last_failure": {"kind": "x"}}, TypeError),
    ],
)
def test_a_document_that_is_not_a_status_is_refused(change: dict[str, Any], error: type):
    data = {**begin().to_json(), **change}
    with pytest.raises(error):
        Status.from_json(data)
    with pytest.raises(KeyError):
        Status.from_json({k: v for k, v in begin().to_json().items() if k != "state"})


def test_restarts_count_within_the_window_only():
    assert restarts_in_window((T0, T0 + 300, T0 + 2000), 1800.0, T0 + 2000) == 2


def test_systemds_line_carries_the_progress_after_the_state():
    status = play(begin(), *launch("r1", ARGV, 7, at_s=0))
    meter = "Loading safetensors checkpoint shards:  45% Completed | 27/60 [00:31<00:38,  1.2s/it]"
    status = fold(status, {"event": "server_output", "line": meter}, T0 + 2)
    assert systemd_line(status, T0 + 2) == (
        "loading (loading weights 45% (27/60 shards, ETA 38 s)); restarts 0; run r1"
    )
