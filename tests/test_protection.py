"""protection: [watchdog] config -> policy limits, restart smaller after a memory kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.config import SupervisorConfig, WatchdogConfig
from supervisor.core.classify import Classification, FailureKind
from supervisor.core.sglang_args import parse_launch_args
from supervisor.death import DeathReport
from supervisor.incident import Incident
from supervisor.launch import RunSettings
from supervisor.protection import Expectation, Protection, limits_from_config
from supervisor.state import StateStore

GB = 10**9
GiB = 2**30
ARGV = (
    "--model-path",
    "m",
    "--tp-size",
    "8",
    "--enable-hierarchical-cache",
    "--hicache-size",
    "40",
)


def test_limits_follow_the_config_and_the_expected_total():
    limits = limits_from_config(WatchdogConfig(kill_percent=0.0), 400 * GB)
    assert limits.kill.bytes_ == 2 * GiB
    assert limits.kill.percent is None
    assert limits.tree_budget_bytes == 400 * GB
    assert limits.tree_kill_bytes == 440 * GB
    assert limits.worst_ramp_bytes_per_s == 6 * GB
    assert limits_from_config(WatchdogConfig(), None).tree_kill_bytes is None


def _protection(tmp_path: Path) -> tuple[Protection, StateStore]:
    settings = RunSettings(
        config=SupervisorConfig(),
        server_command=("python",),
        server_args=ARGV,
        state_dir=tmp_path,
    )
    store = StateStore(tmp_path)
    store.ensure_writable()
    protection = Protection(
        settings,
        sensor=None,
        expected_total_bytes=lambda argv: Expectation(total_bytes=None, pool_bytes_per_rank=None),
    )
    return protection, store


def _report(store: StateStore, kind: FailureKind, argv: tuple[str, ...] = ARGV) -> DeathReport:
    return DeathReport(
        run_id="r1",
        classification=Classification(kind, "hint"),
        exit_status=None,
        was_ready=True,
        pids=(1, 2),
        plan=parse_launch_args(ARGV),
        argv=argv,
        store=store,
    )


def test_a_memory_kill_stores_the_shrunk_size_with_its_reason(tmp_path: Path):
    protection, store = _protection(tmp_path)
    protection.on_death(_report(store, FailureKind.MEMORY_KILL))
    state = store.load()
    assert state.hicache_size_override_gb == 30
    assert "40 -> 30" in (state.override_reason or "")
    # The next kill shrinks what was launched (the override applied), not the original flag.
    shrunk = (*ARGV[:-1], "30")
    protection.on_death(_report(store, FailureKind.MEMORY_KILL, shrunk))
    assert store.load().hicache_size_override_gb == 22


@pytest.mark.parametrize("kind", [FailureKind.RANK_CRASH, FailureKind.HEALTH_TIMEOUT])
def test_other_deaths_leave_the_size_alone(tmp_path: Path, kind: FailureKind):
    protection, store = _protection(tmp_path)
    protection.on_death(_report(store, kind))
    assert store.load().hicache_size_override_gb is None


def test_the_incident_follows_classification_shrink_and_relaunch(tmp_path: Path):
    protection, store = _protection(tmp_path)
    incident = Incident.create(tmp_path, "memory_kill", "test", {})
    assert incident is not None

    class Dog:
        pass

    dog = Dog()
    dog.incident = incident  # type: ignore[attr-defined]
    protection.dog = dog  # type: ignore[assignment]
    protection.on_death(_report(store, FailureKind.MEMORY_KILL))
    steps = [s["step"] for s in json.loads(incident.path.read_text())["next"]]
    assert steps == ["classified", "restart_smaller"]
