"""Signals in the run loop, on a fake clock: stops while loading, during the backoff and before
the first launch; a second signal cutting the drain short; each node's grace; the signals that
leave the server alone (HUP, USR1)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.core.events import KillReason, SignalAction, SignalEvent
from tests.run.runner_support import LOAD_S, WARM_S, names, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


def test_stop_signals_while_loading_and_during_the_backoff_end_the_run_cleanly(tmp_path: Path):
    w = world(tmp_path)
    w.events.at(1.0, SIGTERM)
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path), watch_gpus=False).run() == 0
    assert names(logs) == ["launching", "loading", "stopping", "stopped"]

    w2 = world(tmp_path / "2")
    w2.events.call_at(LOAD_S + WARM_S + 1.0, lambda: w2.server.crash_rank(0))
    w2.events.at(LOAD_S + WARM_S + 5.0, SIGTERM)  # inside the 10 s backoff
    with capture_logs() as logs:
        assert runner(w2, settings(tmp_path / "2"), watch_gpus=False).run() == 0
    assert names(logs)[-3:] == ["restarting", "stopping", "stopped"]
    assert len(w2.launcher.started) == 1


def test_a_second_signal_skips_the_drain(tmp_path: Path):
    w = world(tmp_path)
    w.launcher.on_start = lambda server: setattr(server, "exit_on_term", None)  # ignores SIGTERM
    w.events.at(2.0, SIGTERM)
    w.events.at(7.0, SignalEvent(signal.SIGINT, "SIGINT"))
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path, stop_grace_s=60.0), watch_gpus=False).run() == 0
    escalated = next(e for e in logs if e["event"] == "stop_escalated")
    assert escalated["signal"] == "SIGINT"
    assert w.clock.now < 60.0, "the grace was cut short"
    assert w.launcher.last.poll() is not None


@pytest.mark.parametrize(
    ("extra", "grace_s"),
    [((), 60.0), (("--nnodes", "2", "--node-rank", "1"), 5.0)],
)
def test_a_stop_sigterms_first_and_kills_the_group_after_the_node_s_grace(
    tmp_path: Path, extra: tuple[str, ...], grace_s: float
):
    """Node 0 drains for stop_grace; a worker node (--node-rank >= 1) does not drain in SGLang,
    so it gets worker_stop_grace. A main process that never exits is killed at the deadline."""
    w = world(tmp_path)
    args = ("--model-path", "m", "--tp", "2", *extra)
    run = runner(w, settings(tmp_path, args))
    killed_at: list[float] = []
    stop_at = LOAD_S + WARM_S + 10.0

    def ignore_sigterm() -> None:
        w.server.exit_on_term = None  # the main process stays, as a non-draining node does
        kill_all = w.server.kill_all

        def timed_kill(reason: KillReason) -> tuple[int, ...]:
            killed_at.append(w.clock.now)
            return kill_all(reason)

        w.server.kill_all = timed_kill  # type: ignore[method-assign]

    w.events.call_at(stop_at - 1.0, ignore_sigterm)
    w.events.at(stop_at, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    stopping = next(e for e in logs if e["event"] == "stopping")
    assert stopping["grace_s"] == grace_s
    assert w.server.terminated == 1
    assert killed_at[0] >= stop_at + grace_s
    assert killed_at[0] < stop_at + grace_s + 1.0  # no later than the next poll


def test_sighup_and_sigusr1_leave_the_server_running(tmp_path: Path):
    w = world(tmp_path)
    w.events.at(LOAD_S + WARM_S + 5.0, SignalEvent(signal.SIGHUP, "SIGHUP", SignalAction.RELOAD))
    w.events.at(LOAD_S + WARM_S + 6.0, SignalEvent(signal.SIGUSR1, "SIGUSR1", SignalAction.STATUS))
    w.events.at(LOAD_S + WARM_S + 7.0, SIGTERM)
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path), watch_gpus=False).run() == 0
    refused = next(e for e in logs if e["event"] == "reload_refused")  # no config file to read
    assert "without --config" in refused["reason"]
    status = next(e for e in logs if e["event"] == "status")
    assert (status["state"], status["restart_count"]) == ("ready", 0)
    assert names(logs) == ["launching", "loading", "warming", "ready", "stopping", "stopped"]
    assert len(w.launcher.started) == 1


def test_a_stop_queued_before_the_first_launch_launches_nothing(tmp_path: Path):
    w = world(tmp_path)
    w.events.at(0.0, SIGTERM)
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path), watch_gpus=False).run() == 0
    assert w.launcher.started == []
    assert names(logs) == ["stopped"]
