"""memory.guard and memory.restart_smaller: [watchdog] config -> policy limits, restart smaller
after a memory kill (a ratio converted with the launch's own pre-flight report), the incident
followed to its end."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.config import RunSettings, SupervisorConfig, WatchdogConfig
from supervisor.core.checks import FitReport
from supervisor.core.classify import Classification, FailureKind
from supervisor.core.sglang_args import parse_launch_args
from supervisor.memory.guard import MemoryGuard, limits_from_config
from supervisor.memory.incident import Incident
from supervisor.memory.watchdog import MemoryWatchdog
from supervisor.run.death import DeathReport
from supervisor.run.gpu_wait import ReleaseResult
from supervisor.run.override import launch_override
from supervisor.run.plugins import LaunchInfo
from supervisor.run.state import RunState, StateStore
from tests.fakes import FakeServer

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


def _protection(tmp_path: Path) -> tuple[MemoryGuard, StateStore]:
    settings = RunSettings(
        config=SupervisorConfig(),
        server_command=("python",),
        server_args=ARGV,
        state_dir=tmp_path,
    )
    store = StateStore(tmp_path)
    store.ensure_writable()
    return MemoryGuard(settings, store), store


def _report(
    store: StateStore,
    kind: FailureKind,
    argv: tuple[str, ...] = ARGV,
    fit: FitReport | None = None,
) -> DeathReport:
    return DeathReport(
        run_id="r1",
        classification=Classification(kind, "hint"),
        exit_status=None,
        was_ready=True,
        pids=(1, 2),
        argv=argv,
        plan=parse_launch_args(argv),
        fit=fit,
    )


def _fit(pool_bytes_per_rank: int) -> FitReport:
    """A pre-flight report whose host pool per rank is `pool_bytes_per_rank`."""
    return FitReport(
        model="m",
        attention="mha",
        kv_cache_dtype="bfloat16",
        layers_per_rank=80,
        local_ranks=8,
        bytes_per_token_per_rank=40_960,
        indexer_bytes_per_token_per_rank=0,
        weights_per_rank_bytes=None,
        gpu_memory_bytes=None,
        gpu_free_bytes=None,
        mem_fraction_static=None,
        device_tokens_per_rank=None,
        hicache_mode="ratio",
        hicache_ratio=2.0,
        host_pool_tokens_per_rank=None,
        host_pool_bytes_per_rank=pool_bytes_per_rank,
        host_required_bytes=None,
        host_budget_bytes=0,
        terms=(),
        max_hicache_size_gb=0,
        equivalent_ratio=None,
        safe_host_tokens_per_rank=0,
        avg_request_tokens=4096,
        sglang_version=None,
        checks=(),
    )


def test_a_memory_kill_stores_the_shrunk_size_with_its_reason(tmp_path: Path):
    protection, store = _protection(tmp_path)
    before_s = time.time()
    protection.on_death(_report(store, FailureKind.MEMORY_KILL))
    state = store.load()
    assert state.hicache_size_override_gb == 30
    assert "40 -> 30" in (state.override_reason or "")
    # When it was set: [watchdog] shrink_expires counts from here.
    assert state.override_set_at is not None
    assert before_s <= state.override_set_at <= time.time()
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
        """The guard reads .incident, after waiting for the kill to be reported."""

        waited = False

        def wait_reported(self) -> None:
            self.waited = True

    dog = Dog()
    dog.incident = incident  # type: ignore[attr-defined]
    protection.dog = dog  # type: ignore[assignment]
    protection.on_death(_report(store, FailureKind.MEMORY_KILL))
    steps = [s["step"] for s in json.loads(incident.path.read_text())["next"]]
    assert steps == ["classified", "restart_smaller"]
    assert dog.waited


def test_a_ratio_pool_is_shrunk_from_the_launch_s_own_report_without_a_second_preflight(
    tmp_path: Path,
):
    guard, store = _protection(tmp_path)
    ratio_argv = ("--model-path", "m", "--tp-size", "8", "--enable-hicache", "--hicache-ratio", "2")
    guard.on_death(_report(store, FailureKind.MEMORY_KILL, ratio_argv, fit=_fit(100 * GB)))
    assert store.load().hicache_size_override_gb == 75


def test_a_ratio_pool_without_a_report_is_not_shrunk(tmp_path: Path):
    guard, store = _protection(tmp_path)
    ratio_argv = ("--model-path", "m", "--tp-size", "8", "--enable-hicache", "--hicache-ratio", "2")
    guard.on_death(_report(store, FailureKind.MEMORY_KILL, ratio_argv, fit=None))
    assert store.load().hicache_size_override_gb is None


def test_one_watchdog_per_launch_budgeted_from_that_launch_s_report(tmp_path: Path):
    guard, _store = _protection(tmp_path)
    server = FakeServer(1000, "r1", ranks=2)
    info = LaunchInfo(run_id="r1", argv=ARGV, plan=parse_launch_args(ARGV), fit=_fit(10 * GB))
    with capture_logs() as logs:
        dog = guard.watchdog_for(server, lambda event: None, info)
    assert dog is not None
    assert dog.limits.tree_budget_bytes is None  # this report has no expected total
    limits_event = next(e for e in logs if e["event"] == "watchdog_limits")
    assert limits_event["kill_available_bytes"] == 2 * GiB
    assert "bytes_" not in limits_event
    sized = dataclasses.replace(_fit(10 * GB), host_required_bytes=400 * GB)
    dog = guard.watchdog_for(server, lambda event: None, dataclasses.replace(info, fit=sized))
    assert dog is not None
    assert (dog.limits.tree_budget_bytes, dog.limits.tree_kill_bytes) == (400 * GB, 440 * GB)


def test_a_disabled_watchdog_starts_nothing_but_the_incident_still_notes_the_relaunch(
    tmp_path: Path,
):
    settings = RunSettings(
        config=SupervisorConfig(watchdog=WatchdogConfig(enabled=False)),
        server_command=("python",),
        server_args=ARGV,
        state_dir=tmp_path,
    )
    guard = MemoryGuard(settings, StateStore(tmp_path))
    incident = Incident.create(tmp_path, "memory_kill", "test", {})
    assert incident is not None
    guard.incident = incident
    info = LaunchInfo(run_id="r2", argv=ARGV, plan=parse_launch_args(ARGV), fit=None)
    assert guard.watchdog_for(FakeServer(2000, "r2", ranks=1), lambda e: None, info) is None
    steps = json.loads(incident.path.read_text())["next"]
    assert [(s["step"], s["run_id"]) for s in steps] == [("relaunched", "r2")]
    assert guard.incident is None


def test_a_failed_gpu_release_gets_an_incident_of_its_own_linked_from_the_memory_one(
    tmp_path: Path,
):
    guard, _ = _protection(tmp_path)
    guard.incident = Incident.create(tmp_path, "memory_kill", "test", {})
    guard.record_release(ReleaseResult(ok=True, reason="all target GPUs are free", elapsed_s=1.0))
    guard.record_release(ReleaseResult(ok=False, reason="GPU 3 reset failed", elapsed_s=9.0))
    assert guard.incident is not None
    steps = [s["step"] for s in json.loads(guard.incident.path.read_text())["next"]]
    assert steps == ["gpu_release", "gpu_release", "gpu_unrecoverable"]
    own = list(tmp_path.glob("incident-*gpu_unrecoverable*.json"))
    assert len(own) == 1
    assert json.loads(own[0].read_text())["summary"] == "GPU 3 reset failed"


def _launch(guard: MemoryGuard, argv: tuple[str, ...] = ARGV) -> MemoryWatchdog:
    info = LaunchInfo(run_id="r1", argv=argv, plan=parse_launch_args(argv), fit=None)
    dog = guard.watchdog_for(FakeServer(1000, "r1", ranks=2), lambda event: None, info)
    assert dog is not None
    assert dog.keep_shrink is not None
    return dog


@pytest.mark.parametrize("urgent", [True, False])
def test_the_watchdog_s_shrink_is_in_the_state_file_before_the_kill_and_a_restart_uses_it(
    tmp_path: Path, urgent: bool
):
    """The supervisor dies between the watchdog's signal and the classification: the state
    file has the smaller size already, and the next supervisor's launch takes it."""
    guard, store = _protection(tmp_path)
    dog = _launch(guard)
    assert dog.keep_shrink is not None
    with capture_logs() as logs:
        dog.keep_shrink(urgent)
    on_disk = json.loads(store.path.read_text())
    assert on_disk["hicache_size_override_gb"] == 30
    assert "40 -> 30" in on_disk["override_reason"]
    # Urgent (before a SIGKILL) logs nothing: a blocked log must not hold the kill.
    assert [e["event"] for e in logs] == ([] if urgent else ["hicache_shrink_saved"])
    restarted = StateStore(tmp_path)
    argv = launch_override(guard.settings, restarted, time.time())
    assert argv[argv.index("--hicache-size") + 1] == "30"


def test_the_classification_confirms_the_size_the_watchdog_kept(tmp_path: Path):
    guard, store = _protection(tmp_path)
    dog = _launch(guard)
    assert dog.keep_shrink is not None
    dog.keep_shrink(True)
    dog.keep_shrink(False)
    dog.keep_shrink(False)  # once per launch: the second durable call writes nothing
    with capture_logs() as logs:
        guard.on_death(_report(store, FailureKind.MEMORY_KILL))
    assert store.load().hicache_size_override_gb == 30  # 40 × 0.75 once, not twice
    shrunk = [e for e in logs if e["event"] == "hicache_shrunk"]
    assert [(e["previous_gb"], e["hicache_size_gb"]) for e in shrunk] == [(40, 30)]


def test_a_server_without_the_hierarchical_cache_gets_nothing_kept(tmp_path: Path):
    guard, store = _protection(tmp_path)
    dog = _launch(guard, ("--model-path", "m", "--tp-size", "8"))
    assert dog.keep_shrink is not None
    dog.keep_shrink(True)
    dog.keep_shrink(False)
    assert not store.path.exists()


def test_before_a_sigkill_the_shrink_does_not_wait_for_a_run_loop_writing_the_state(
    tmp_path: Path,
):
    """The kill goes first; the size follows in the durable write right after it."""
    guard, store = _protection(tmp_path)
    dog = _launch(guard)
    assert dog.keep_shrink is not None
    held, release = threading.Event(), threading.Event()

    def slow(state: RunState) -> RunState:
        held.set()
        release.wait(10)
        return state

    writer = threading.Thread(target=store.update, args=(slow,))
    writer.start()
    try:
        assert held.wait(10)
        dog.keep_shrink(True)  # returns at once: the lock is taken
        assert not store.path.exists()
    finally:
        release.set()
        writer.join()
    dog.keep_shrink(False)
    assert store.load().hicache_size_override_gb == 30
