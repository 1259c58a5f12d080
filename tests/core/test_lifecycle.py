"""Server lifecycle: the transition table and the progress-aware startup deadline."""

from __future__ import annotations

import itertools

import pytest

from supervisor.core.lifecycle import (
    TRANSITIONS,
    HealthStatus,
    IllegalTransition,
    ServerState,
    StartupVerdict,
    StartupWatch,
    check_transition,
    state_for_startup_probe,
)

S = ServerState


@pytest.mark.parametrize(
    ("path"),
    [
        [S.STOPPED, S.LAUNCHING, S.LOADING, S.WARMING, S.READY, S.STOPPING, S.STOPPED],
        [S.STOPPED, S.LAUNCHING, S.LOADING, S.READY, S.UNHEALTHY, S.BACKOFF, S.LAUNCHING],
        [S.LAUNCHING, S.UNHEALTHY, S.FATAL],
        [S.BACKOFF, S.STOPPING, S.STOPPED],
        [S.UNHEALTHY, S.STOPPING],
        [S.STOPPED, S.FATAL],  # the pre-flight refuses the first launch
        [S.BACKOFF, S.FATAL],  # the GPUs stay dirty
    ],
)
def test_the_stories_of_a_server_are_legal(path):
    for current, new in itertools.pairwise(path):
        assert check_transition(current, new) is new


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (S.STOPPED, S.READY),
        (S.READY, S.LOADING),
        (S.FATAL, S.LAUNCHING),
        (S.STOPPING, S.LAUNCHING),
        (S.BACKOFF, S.READY),
        (S.READY, S.BACKOFF),  # a dead server's tree is killed (unhealthy) before any backoff
    ],
)
def test_illegal_transitions_raise_naming_both_states(current, new):
    with pytest.raises(IllegalTransition, match=f"{current.value} -> {new.value}"):
        check_transition(current, new)


def test_every_state_has_a_row_and_values_are_event_names():
    assert set(TRANSITIONS) == set(ServerState)
    assert {s.value for s in ServerState} >= {"launching", "loading", "ready", "unhealthy"}


def test_probe_answers_map_to_startup_states():
    assert state_for_startup_probe(HealthStatus.READY) is S.READY
    assert state_for_startup_probe(HealthStatus.WARMING) is S.WARMING
    assert state_for_startup_probe(HealthStatus.REFUSED) is None
    assert state_for_startup_probe(HealthStatus.TIMEOUT) is None


MIB = 1024**2


def test_a_load_that_keeps_growing_is_never_stalled_but_hits_the_hard_limit():
    watch = StartupWatch.begin(0.0)
    for t in range(1, 100):
        watch = watch.observe(
            float(t * 10), memory_bytes=t * 100 * MIB, log_lines=0, min_growth_bytes=64 * MIB
        )
        assert watch.verdict(float(t * 10), stall_timeout_s=60, timeout_s=1000) in (
            StartupVerdict.OK,
            StartupVerdict.TIMED_OUT,
        )
    assert watch.verdict(990.0, stall_timeout_s=60, timeout_s=1000) is StartupVerdict.OK
    assert watch.verdict(1000.0, stall_timeout_s=60, timeout_s=1000) is StartupVerdict.TIMED_OUT


def test_flat_memory_and_no_log_lines_is_a_stall():
    watch = StartupWatch.begin(0.0).observe(1.0, 500 * MIB, 3, min_growth_bytes=64 * MIB)
    for t in (10.0, 30.0, 60.0):
        watch = watch.observe(t, 500 * MIB + 10 * MIB, 3, min_growth_bytes=64 * MIB)
    assert watch.last_progress_at_s == 1.0
    assert watch.verdict(60.9, stall_timeout_s=60, timeout_s=1000) is StartupVerdict.OK
    assert watch.verdict(61.0, stall_timeout_s=60, timeout_s=1000) is StartupVerdict.STALLED
    assert watch.time_left_s(31.0, stall_timeout_s=60, timeout_s=1000) == pytest.approx(30.0)


def test_log_lines_count_as_progress_and_memory_falling_does_not():
    watch = StartupWatch.begin(0.0).observe(1.0, 900 * MIB, 0, min_growth_bytes=64 * MIB)
    watch = watch.observe(50.0, 100 * MIB, 0, min_growth_bytes=64 * MIB)
    assert watch.last_progress_at_s == 1.0
    watch = watch.observe(55.0, 100 * MIB, 1, min_growth_bytes=64 * MIB)
    assert watch.last_progress_at_s == 55.0
    assert watch.peak_memory_bytes == 900 * MIB
    assert watch.time_left_s(55.0, stall_timeout_s=60, timeout_s=70) == pytest.approx(15.0)
