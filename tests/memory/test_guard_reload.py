"""MemoryGuard.on_reload: a reload's [watchdog] levels reach the running watchdog at once, its
tree budget kept from its launch; the rest of [watchdog] waits for the next launch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.config import RunSettings, SupervisorConfig, WatchdogConfig
from supervisor.core.readings import HostMemory
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GB, GiB
from supervisor.memory.guard import MemoryGuard
from supervisor.run.plugins import LaunchInfo
from supervisor.run.state import StateStore
from tests.fakes import FakeServer
from tests.memory.test_guard import ARGV, _fit


def _settings(tmp_path: Path, watchdog: WatchdogConfig) -> RunSettings:
    return RunSettings(
        config=SupervisorConfig(watchdog=watchdog),
        server_command=("python",),
        server_args=ARGV,
        state_dir=tmp_path,
    )


def test_new_levels_reach_the_running_watchdog_and_the_budget_stays(tmp_path: Path) -> None:
    host = HostMemory(total_bytes=1000 * GB, available_bytes=900 * GB)
    guard = MemoryGuard(
        _settings(tmp_path, WatchdogConfig()), StateStore(tmp_path), read_host=lambda _tree: host
    )
    fit = dataclasses.replace(_fit(10 * GB), host_required_bytes=400 * GB)
    info = LaunchInfo(run_id="r1", argv=ARGV, plan=parse_launch_args(ARGV), fit=fit)
    dog = guard.watchdog_for(FakeServer(1000, "r1", ranks=2), lambda event: None, info)
    assert dog is not None
    guard.on_reload(_settings(tmp_path, WatchdogConfig(kill_bytes=1 * GiB)))
    assert dog.limits.kill.bytes_ == 2 * GiB  # not running: the next launch builds its own
    dog.start()
    try:
        new = WatchdogConfig(kill_bytes=1 * GiB, warn_ticks=5, enabled=False)
        with capture_logs() as logs:
            guard.on_reload(_settings(tmp_path, new))
        assert (dog.limits.kill.bytes_, dog.limits.warn_ticks) == (1 * GiB, 5)
        assert (dog.limits.tree_budget_bytes, dog.limits.tree_kill_bytes) == (400 * GB, 440 * GB)
        reloaded = next(e for e in logs if e["event"] == "watchdog_limits_reloaded")
        assert reloaded["kill_available_bytes"] == 1 * GiB
        assert dog.is_running  # `enabled = false` waits for the next launch
        assert guard.cfg.enabled is False
        with capture_logs() as logs:
            guard.on_reload(_settings(tmp_path, new))  # the same levels: nothing to say
        assert [e for e in logs if e["event"] == "watchdog_limits_reloaded"] == []
    finally:
        dog.stop()
