"""SIGHUP in the run loop, on a fake clock: what a reload applies at once, what waits for the
server's next launch (or drains and relaunches it with [run] restart_on_reload), what waits for
the supervisor's restart, and a new config that is refused while the old one stays."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from supervisor.config import GpuConfig, HooksConfig, RunSettings
from supervisor.core.events import SignalAction, SignalEvent
from supervisor.errors import ConfigError
from supervisor.run.plugins import Plugins
from supervisor.run.runner import Runner
from tests.fakes import FakeServer
from tests.run.runner_support import ARGS, LOAD_S, WARM_S, World, names, runner, settings, world

SIGHUP = SignalEvent(signal.SIGHUP, "SIGHUP", SignalAction.RELOAD)
SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")
READY_AT = LOAD_S + WARM_S


def reloading(w: World, start: RunSettings, source: Callable[[], RunSettings], **kw: Any) -> Runner:
    run = runner(w, start, watch_gpus=False, **kw)
    run.io = dataclasses.replace(run.io, reload_settings=source)
    return run


def with_run(base: RunSettings, **run: Any) -> RunSettings:
    config = dataclasses.replace(base.config, run=dataclasses.replace(base.config.run, **run))
    return dataclasses.replace(base, config=config)


def test_a_new_health_interval_applies_at_once_to_the_same_server(tmp_path: Path) -> None:
    start = settings(tmp_path, health_interval_s=10.0)
    new = with_run(start, health_interval_s=1.0, failure_threshold=5, max_restarts=9)
    w = world(tmp_path)
    run = reloading(w, start, lambda: new)
    counts: list[int] = []
    for at in (READY_AT + 10.0, READY_AT + 40.0, READY_AT + 50.0, READY_AT + 80.0):
        w.events.call_at(at, lambda: counts.append(w.probe.calls))
    w.events.at(READY_AT + 45.0, SIGHUP)
    w.events.at(READY_AT + 90.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert len(w.launcher.started) == 1  # the server was never touched
    reloaded = next(e for e in logs if e["event"] == "reloaded")
    assert reloaded["applied"] == [
        "run.failure_threshold",
        "run.health_interval",
        "run.max_restarts",
    ]
    assert reloaded["restart_server"] is False
    assert [e for e in logs if e["event"] == "reload_pending"] == []
    before, after = counts[1] - counts[0], counts[3] - counts[2]
    assert before <= 4  # every 10 s over 30 s
    assert after >= 25  # every second over 30 s: the monitor read the new interval
    assert run.budget.policy.max_restarts == 9
    assert names(logs) == ["launching", "loading", "warming", "ready", "stopping", "stopped"]


def test_a_bad_new_config_is_refused_and_the_old_one_stays(tmp_path: Path) -> None:
    start = settings(tmp_path)

    def broken() -> RunSettings:
        raise ConfigError("config key run.failure_threshold must be at least 1 (got 0)")

    w = world(tmp_path)
    run = reloading(w, start, broken)
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 10.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    refused = next(e for e in logs if e["event"] == "reload_refused")
    assert "run.failure_threshold" in refused["reason"]
    assert refused["log_level"] == "error"
    assert run.settings is start
    assert len(w.launcher.started) == 1
    assert [e for e in logs if e["event"] == "reloaded"] == []


def test_a_bug_while_reloading_is_refused_too_and_never_kills_the_server(tmp_path: Path) -> None:
    def buggy() -> RunSettings:
        raise RuntimeError("boom")

    w = world(tmp_path)
    run = reloading(w, settings(tmp_path), buggy)
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 10.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert next(e for e in logs if e["event"] == "reload_refused")["reason"] == "internal error"
    assert names(logs)[-2:] == ["stopping", "stopped"]
    assert len(w.launcher.started) == 1


def _with_env(base: RunSettings, **env: str) -> RunSettings:
    server = dataclasses.replace(base.config.server, env=env)
    return dataclasses.replace(base, config=dataclasses.replace(base.config, server=server))


def test_a_new_environment_waits_for_the_next_restart_of_the_server(tmp_path: Path) -> None:
    start = settings(tmp_path)
    new = _with_env(start, HF_HOME="/data/hf", HF_TOKEN="hf_reload_secret")
    w = world(tmp_path)
    run = reloading(w, start, lambda: new)
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.call_at(READY_AT + 20.0, lambda: w.server.crash_rank(0))
    w.events.at(READY_AT + 60.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    pending = next(e for e in logs if e["event"] == "reload_pending")
    assert pending["keys"] == ["server.env"]
    assert "next restart of the server" in pending["detail"]
    first, second = w.launcher.envs
    assert "HF_HOME" not in first
    assert second["HF_HOME"] == "/data/hf"  # the relaunch after the crash
    assert run.redact("token hf_reload_secret") == "token ***"  # masked from the reload on


def test_restart_on_reload_drains_and_relaunches_without_counting_a_failure(
    tmp_path: Path,
) -> None:
    start = settings(tmp_path)
    new = with_run(_with_env(start, HF_HOME="/data/hf"), restart_on_reload=True)
    w = world(tmp_path)
    run = reloading(w, start, lambda: new)
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 60.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert names(logs) == [
        *("launching", "loading", "warming", "ready", "stopping", "stopped"),
        *("launching", "loading", "warming", "ready", "stopping", "stopped"),
    ]
    stopping = [e for e in logs if e["event"] == "stopping"]
    assert stopping[0]["reason"] == "reload"
    assert stopping[1]["reason"] == "SIGTERM"
    first, _second = w.launcher.started
    assert first.terminated == 1  # drained: SIGTERM to the main process first
    assert "HF_HOME" in w.launcher.envs[1]
    assert run.budget.total_restarts == 0
    # systemd hears STOPPING=1 only for the real stop: the unit stays active through a reload.
    assert sum(m.startswith("STOPPING=1") for m in w.notifier.messages) == 1
    assert next(e for e in logs if e["event"] == "reloaded")["restart_server"] is True


def test_what_is_set_up_at_start_keeps_its_old_value(tmp_path: Path) -> None:
    start = settings(tmp_path)
    renamed = with_run(start, name="renamed", health_interval_s=2.0)
    gpu = GpuConfig(release_timeout_s=99.0, backend="none")
    new = dataclasses.replace(
        renamed,
        config=dataclasses.replace(renamed.config, gpu=gpu),
        state_dir=tmp_path / "elsewhere",
    )
    w = world(tmp_path)
    run = reloading(w, start, lambda: new)
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 10.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    pending = next(e for e in logs if e["event"] == "reload_pending")
    assert pending["keys"] == ["gpu.backend", "gpu.release_timeout", "run.name"]
    assert "supervisor restarts" in pending["detail"]
    assert run.settings.config.gpu == start.config.gpu
    assert run.settings.instance == start.instance
    assert run.settings.state_dir == start.state_dir
    assert run.run_cfg.health_interval_s == 2.0  # the rest of the reload applies


def test_an_argv_on_other_gpus_is_refused(tmp_path: Path) -> None:
    start = settings(tmp_path)
    new = dataclasses.replace(start, server_args=(*ARGS[:3], "4", *ARGS[4:]))  # --tp 4
    w = world(tmp_path)
    run = reloading(w, start, lambda: new)
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 10.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    refused = next(e for e in logs if e["event"] == "reload_refused")
    assert "GPUs [0, 1, 2, 3]" in refused["reason"]
    assert "restart the supervisor" in refused["reason"]
    assert run.settings is start


def test_reload_hooks_get_the_new_settings_and_nothing_changed_is_said(tmp_path: Path) -> None:
    start = settings(tmp_path)
    hooks = HooksConfig(on_ready=("/bin/true",))
    new = dataclasses.replace(start, config=dataclasses.replace(start.config, hooks=hooks))
    told: list[RunSettings] = []
    sources = iter([new, new])
    w = world(tmp_path)
    run = reloading(w, start, lambda: next(sources), plugins=Plugins(reload_hooks=(told.append,)))
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 6.0, SIGHUP)
    w.events.at(READY_AT + 10.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    first, second = (e for e in logs if e["event"] == "reloaded")
    assert first["applied"] == ["hooks.on_ready"]
    assert (second["applied"], second["detail"]) == ([], "nothing changed")
    assert told[0].config.hooks == hooks


def test_a_reload_during_the_backoff_applies_at_the_relaunch(tmp_path: Path) -> None:
    start = settings(tmp_path)
    new = with_run(_with_env(start, HF_HOME="/x"), restart_on_reload=True)
    w = world(tmp_path)
    run = reloading(w, start, lambda: new)
    w.events.call_at(READY_AT + 5.0, lambda: w.server.crash_rank(0))
    w.events.at(READY_AT + 8.0, SIGHUP)  # inside the 10 s backoff: no server to drain
    w.events.at(READY_AT + 60.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert [e["reason"] for e in logs if e["event"] == "stopping"] == ["SIGTERM"]
    assert w.launcher.envs[1]["HF_HOME"] == "/x"
    assert len(w.launcher.started) == 2


def test_server_config_is_part_of_the_view(tmp_path: Path) -> None:
    from supervisor.run.reload import config_view

    base = settings(tmp_path)
    view = config_view(base)
    assert view["server.args"] == base.server_args
    assert view["run.health_interval"] == base.run.health_interval_s
    assert view["server.model_config"] == base.config.server.model_config


def test_a_stop_during_a_reload_s_drain_ends_the_run_without_a_relaunch(tmp_path: Path) -> None:
    start = settings(tmp_path, stop_grace_s=60.0)
    new = with_run(_with_env(start, HF_HOME="/x"), restart_on_reload=True, stop_grace_s=60.0)
    w = world(tmp_path)
    run = reloading(w, start, lambda: new)
    # The main process ignores SIGTERM: the reload's drain would last the whole grace.

    def ignores_sigterm(server: FakeServer) -> None:
        w.on_start(server)
        server.exit_on_term = None

    w.launcher.on_start = ignores_sigterm
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 10.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert len(w.launcher.started) == 1
    assert next(e for e in logs if e["event"] == "stop_escalated")["signal"] == "SIGTERM"
    # The reload's drain, cut short, then the stop: no relaunch.
    assert names(logs)[-3:] == ["stopping", "stopped", "stopped"]
    assert [e for e in logs if e["event"] == "stopped"][-1]["reason"] == "SIGTERM"
    assert w.clock.now < READY_AT + 60.0


def test_the_health_probe_reads_the_timeout_at_each_check(tmp_path: Path, monkeypatch) -> None:
    from supervisor.adapters.health import HttpHealthProbe
    from supervisor.core.lifecycle import HealthStatus
    from supervisor.core.sglang_args import parse_launch_args
    from supervisor.run.reload import live_probes

    seen: list[tuple[str, float]] = []

    def check(self: HttpHealthProbe) -> HealthStatus:
        seen.append((self.url, self.timeout_s))
        return HealthStatus.READY

    monkeypatch.setattr(HttpHealthProbe, "check", check)
    current = [settings(tmp_path, health_timeout_s=25.0).run]
    probe = live_probes(lambda: current[0])(parse_launch_args(("--model-path", "m", "--port", "9")))
    assert probe() is HealthStatus.READY
    current[0] = dataclasses.replace(current[0], health_timeout_s=3.0, health_path="/other")
    probe()
    assert seen == [("http://127.0.0.1:9/health", 25.0), ("http://127.0.0.1:9/health", 3.0)]
