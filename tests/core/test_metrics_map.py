"""Which log event changes which metric (supervisor/core/metrics_map.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from supervisor.core.classify import FailureKind
from supervisor.core.lifecycle import ServerState
from supervisor.core.metrics_map import (
    OTHER,
    SPECS,
    EventMapper,
    Kind,
    Op,
    Update,
    incident_kind,
    kill_rule,
)


def _hicache(argv: Sequence[str]) -> int | None:
    if "--hicache-size" not in argv:
        return 0
    return int(argv[list(argv).index("--hicache-size") + 1]) * 1_000_000_000


def feed(mapper: EventMapper, name: str, t_s: float = 0.0, **fields: Any) -> list[Update]:
    return mapper.feed({"event": name, **fields}, mono_s=t_s, wall_s=1_700_000_000.0 + t_s)


def only(updates: list[Update], metric: str) -> list[Update]:
    return [u for u in updates if u.metric == metric]


def current_state(updates: list[Update]) -> list[str | None]:
    return [u.label for u in only(updates, "server_state") if u.value == 1.0]


def test_every_metric_is_named_in_base_units_and_counters_end_in_total():
    names = [s.name for s in SPECS]
    assert len(names) == len(set(names))
    for spec in SPECS:
        assert spec.name.endswith("_total") == (spec.kind is Kind.COUNTER), spec.name
        if spec.kind is Kind.HISTOGRAM:
            assert spec.name.endswith("_seconds")
            assert list(spec.buckets) == sorted(spec.buckets)


def test_the_state_gauge_is_one_for_the_current_state_only_and_restarting_is_backoff():
    mapper = EventMapper(_hicache)
    start = mapper.initial("1.2.3")
    assert Update("build_info", Op.SET, 1.0, "1.2.3") in start
    assert current_state(start) == ["stopped"]
    assert len(only(start, "server_state")) == len(ServerState)
    assert current_state(feed(mapper, "loading")) == ["loading"]
    backoff = feed(mapper, "restarting", failure="rank_crash")
    assert current_state(backoff) == ["backoff"]
    assert all(u.value == 0.0 for u in only(backoff, "server_state") if u.label != "backoff")
    assert only(feed(mapper, "restarting", failure="rank_crash"), "server_state") == []


def test_a_launch_to_ready_is_one_startup_duration_and_sets_the_start_time():
    mapper = EventMapper(_hicache)
    launching = feed(mapper, "launching", 100.0, argv=["--tp", "2", "--hicache-size", "80"])
    assert only(launching, "hicache_size_bytes_per_rank") == [
        Update("hicache_size_bytes_per_rank", Op.SET, 80e9)
    ]
    launched = feed(mapper, "server_launched", 100.5, pid=7)
    assert only(launched, "server_start_time_seconds") == [
        Update("server_start_time_seconds", Op.SET, 1_700_000_100.5)
    ]
    ready = feed(mapper, "ready", 160.0)
    assert only(ready, "startup_duration_seconds") == [
        Update("startup_duration_seconds", Op.OBSERVE, 60.0)
    ]
    # Readiness is observed once per launch.
    assert only(feed(mapper, "ready", 170.0), "startup_duration_seconds") == []


def test_hicache_size_is_unset_when_sglang_sizes_the_pool_itself():
    mapper = EventMapper(lambda _argv: None)
    assert only(
        feed(mapper, "launching", argv=["--hicache-ratio", "2"]), "hicache_size_bytes_per_rank"
    ) == [Update("hicache_size_bytes_per_rank", Op.UNSET)]


def test_a_failure_counts_one_exit_by_kind_and_a_restart_by_reason():
    mapper = EventMapper(_hicache)
    feed(mapper, "launching", argv=[])
    feed(mapper, "server_launched")
    failed = feed(mapper, "server_failed", failure="rank_crash", hint="free text", pids=[1, 2])
    assert Update("server_exits_total", Op.INC, label="rank_crash") in failed
    assert Update("server_start_time_seconds", Op.UNSET) in failed
    assert Update("tree_memory_bytes", Op.UNSET) in failed
    restarting = feed(mapper, "restarting", failure="rank_crash", delay_s=0.1)
    assert only(restarting, "restarts_total") == [
        Update("restarts_total", Op.INC, label="rank_crash")
    ]


def test_a_requested_stop_is_an_exit_of_kind_stopped_but_only_of_a_running_server():
    mapper = EventMapper(_hicache)
    feed(mapper, "server_launched")
    feed(mapper, "stopping", reason="SIGTERM")
    assert only(feed(mapper, "stopped"), "server_exits_total") == [
        Update("server_exits_total", Op.INC, label="stopped")
    ]
    # A stop during a backoff (no server) or after the tree failed ends nothing more.
    feed(mapper, "server_launched")
    feed(mapper, "server_failed", failure="rank_crash")
    feed(mapper, "stopping", reason="SIGTERM")
    assert only(feed(mapper, "stopped"), "server_exits_total") == []


def test_labels_never_carry_free_text():
    mapper = EventMapper(_hicache)
    feed(mapper, "server_launched")
    odd = feed(mapper, "server_failed", failure="it broke at 3am: see /tmp/x")
    assert only(odd, "server_exits_total")[0].label == OTHER
    assert only(feed(mapper, "restarting", failure=None), "restarts_total")[0].label == OTHER
    assert incident_kind("memory_kill") == "memory_kill"
    assert incident_kind("Something happened!") == OTHER
    assert incident_kind(3) == OTHER


@pytest.mark.parametrize(
    ("reason", "rule"),
    [
        ("host memory available 1.9 GB at or below the kill level 2.0 GB", "host_kill_level"),
        (
            "server tree uses 90 GB (RssAnon+RssShmem), at or above its budget plus margin",
            "tree_budget",
        ),
        ("host memory falls 5.0 GB/s: 3 GB available would cross the kill level", "host_trend"),
        ("server tree grows 2 GB/s: 80 GB would cross its budget plus margin", "tree_trend"),
        ("SIGTERM grace of 5 s expired with memory still short", "terminate_grace_expired"),
        ("host memory available 3 GB at or below the terminate level 4 GB", "host_terminate_level"),
        ("a reason nobody wrote yet", OTHER),
        (None, OTHER),
    ],
)
def test_a_watchdog_kill_is_counted_by_the_rule_that_fired(reason, rule):
    assert kill_rule(reason) == rule


def test_watchdog_events_feed_the_memory_gauges_and_the_kill_counter():
    mapper = EventMapper(_hicache)
    report = feed(mapper, "memory_report", available_bytes=400e9, tree_charged_bytes=30e9)
    assert Update("host_memory_available_bytes", Op.SET, 400e9) in report
    assert Update("tree_memory_bytes", Op.SET, 30e9) in report
    killed = feed(
        mapper,
        "server_killed",
        cause="memory_kill",
        reason="SIGTERM grace of 5 s expired with memory still short",
        available_bytes=1e9,
        tree_charged_bytes=440e9,
    )
    assert Update("watchdog_kills_total", Op.INC, label="terminate_grace_expired") in killed
    assert Update("host_memory_available_bytes", Op.SET, 1e9) in killed
    assert feed(mapper, "watchdog_limits", tree_budget_bytes=300e9) == [
        Update("tree_budget_bytes", Op.SET, 300e9)
    ]
    assert feed(mapper, "watchdog_limits", tree_budget_bytes=None) == [
        Update("tree_budget_bytes", Op.UNSET)
    ]
    assert feed(mapper, "hicache_shrunk", previous_gb=80, hicache_size_gb=60) == [
        Update("hicache_shrinks_total", Op.INC)
    ]


def test_only_health_checks_of_a_ready_server_are_timed_and_failures_counted():
    mapper = EventMapper(_hicache)
    assert feed(mapper, "health_check", result="refused", duration_s=0.001, state="loading") == []
    ok = feed(mapper, "health_check", result="ready", duration_s=0.02, state="ready")
    assert ok == [Update("health_check_duration_seconds", Op.OBSERVE, 0.02)]
    slow = feed(mapper, "health_check", result="timeout", duration_s=25.0, state="ready")
    assert Update("health_check_failures_total", Op.INC, label="timeout") in slow
    unavailable = feed(mapper, "health_check", result="warming", duration_s=None, state="ready")
    assert unavailable == [Update("health_check_failures_total", Op.INC, label="http_503")]


def test_gpu_release_waits_resets_and_incidents():
    mapper = EventMapper(_hicache)
    assert feed(mapper, "gpu_release_done", elapsed_s=26.5, gpus=[0, 1]) == [
        Update("gpu_release_wait_seconds", Op.OBSERVE, 26.5)
    ]
    assert feed(mapper, "gpu_release_failed", elapsed_s=120.0, reason="held") == [
        Update("gpu_release_wait_seconds", Op.OBSERVE, 120.0)
    ]
    assert feed(mapper, "gpu_reset_done", gpu=3) == [Update("gpu_resets_total", Op.INC, label="ok")]
    assert feed(mapper, "gpu_reset_failed", gpu=3) == [
        Update("gpu_resets_total", Op.INC, label="failed")
    ]
    assert feed(mapper, "incident_written", kind="gpu_unrecoverable", path="/x") == [
        Update("incidents_total", Op.INC, label="gpu_unrecoverable")
    ]


def test_events_that_mean_nothing_to_the_metrics_change_nothing():
    mapper = EventMapper(_hicache)
    assert feed(mapper, "server_output", line="Load weight begin") == []
    assert feed(mapper, "memory_report", available_bytes="a lot") == []
    assert mapper.feed({"no": "event"}, mono_s=0.0, wall_s=0.0) == []


def test_every_failure_kind_is_a_known_restart_reason():
    restarts = next(s for s in SPECS if s.name == "restarts_total")
    assert set(restarts.initial) == {k.value for k in FailureKind}
