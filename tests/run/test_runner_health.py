"""The run loop's liveness after ready, in-process on the fake clock: failing health checks
restart the server, and the death says what the server last answered."""

from __future__ import annotations

import signal
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.core.classify import FailureKind
from supervisor.core.events import SignalEvent
from supervisor.core.lifecycle import HealthStatus
from tests.run.runner_support import LOAD_S, WARM_S, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


def test_failing_health_checks_after_ready_restart_the_server(tmp_path: Path):
    w = world(tmp_path)
    hang = w.events.call_at
    hang(LOAD_S + WARM_S + 50.0, lambda: setattr(w.probe, "answer", HealthStatus.TIMEOUT))
    w.events.at(150.0, SIGTERM)
    run = runner(w, settings(tmp_path, failure_threshold=3), watch_gpus=False)
    with capture_logs() as logs:
        assert run.run() == 0
    unhealthy = next(e for e in logs if e["event"] == "unhealthy")
    assert unhealthy["cause"] is FailureKind.HEALTH_TIMEOUT
    assert "3 consecutive failed health checks" in str(unhealthy["detail"])
    assert len(w.launcher.started) == 2


def test_a_503_after_ready_is_reported_as_503_not_as_warming(tmp_path: Path):
    w = world(tmp_path)
    hang = w.events.call_at
    hang(LOAD_S + WARM_S + 50.0, lambda: setattr(w.probe, "answer", HealthStatus.WARMING))
    w.events.at(150.0, SIGTERM)
    run = runner(w, settings(tmp_path, failure_threshold=3), watch_gpus=False)
    with capture_logs() as logs:
        assert run.run() == 0
    unhealthy = next(e for e in logs if e["event"] == "unhealthy")
    assert "3 consecutive failed health checks (last: 503)" in str(unhealthy["detail"])
