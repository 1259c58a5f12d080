"""run.override: the state file's --hicache-size override at each launch, said with since when
and until when, and dropped (from the state file too) once [watchdog] shrink_expires passed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.config import RunSettings, WatchdogConfig
from supervisor.core.shrink import override_expired, override_expires_at
from supervisor.run.override import apply_override, launch_override, utc_text
from supervisor.run.state import RunState, StateStore
from tests.fakes import FakeClock
from tests.run.runner_support import ARGS, settings

SET_AT = 1_700_000_000.0  # 2023-11-14T22:13:20Z
DAY_S = 86400.0


def test_the_override_replaces_the_size_in_place_and_says_since_when():
    state = RunState(
        hicache_size_override_gb=30, override_reason="memory kill", override_set_at=SET_AT
    )
    with capture_logs() as logs:
        argv = apply_override(ARGS, state)
    assert argv[-2:] == ("--hicache-size", "30")
    applied = logs[0]
    assert applied["event"] == "hicache_override_applied"
    assert applied["since"] == "2023-11-14T22:13:20Z"
    assert applied["expires"].startswith("never")
    assert apply_override(ARGS, RunState()) == ARGS


def test_with_shrink_expires_it_says_when_it_lapses():
    state = RunState(hicache_size_override_gb=30, override_set_at=SET_AT)
    with capture_logs() as logs:
        apply_override(ARGS, state, expires_s=DAY_S)
    assert logs[0]["expires"] == "2023-11-15T22:13:20Z"
    assert override_expires_at(SET_AT, DAY_S) == SET_AT + DAY_S
    assert override_expires_at(SET_AT, 0.0) is None  # off
    assert override_expires_at(None, DAY_S) is None  # time unknown
    assert not override_expired(SET_AT, DAY_S, SET_AT + DAY_S - 1)
    assert override_expired(SET_AT, DAY_S, SET_AT + DAY_S)
    assert utc_text(None) is None


def _with_expiry(tmp_path: Path, expires_s: float) -> RunSettings:
    run = settings(tmp_path)
    watchdog = WatchdogConfig(shrink_expires_s=expires_s)
    return dataclasses.replace(run, config=dataclasses.replace(run.config, watchdog=watchdog))


def test_an_expired_override_is_cleared_from_the_state_and_the_full_size_launches(tmp_path):
    store = StateStore(tmp_path, clock=FakeClock(start_s=0.0))
    store.save(
        RunState(hicache_size_override_gb=30, override_reason="kill", override_set_at=SET_AT)
    )
    run = _with_expiry(tmp_path, DAY_S)
    with capture_logs() as logs:
        kept = launch_override(run, store, SET_AT + DAY_S - 1)
    assert kept[-1] == "30"
    assert store.load().hicache_size_override_gb == 30
    with capture_logs() as logs:
        argv = launch_override(run, store, SET_AT + DAY_S)
    assert argv == ARGS  # the operator's --hicache-size 40
    assert [e["event"] for e in logs] == ["hicache_override_expired"]
    after = store.load()
    assert (after.hicache_size_override_gb, after.override_reason, after.override_set_at) == (
        None,
        None,
        None,
    )


def test_an_override_of_unknown_age_starts_its_time_now_and_without_expiry_stays(tmp_path):
    store = StateStore(tmp_path, clock=FakeClock(start_s=0.0))
    store.save(RunState(hicache_size_override_gb=30))  # written before its time was recorded
    assert launch_override(_with_expiry(tmp_path, 0.0), store, SET_AT)[-1] == "30"
    assert store.load().override_set_at is None  # expiry off: nothing to count from
    assert launch_override(_with_expiry(tmp_path, DAY_S), store, SET_AT)[-1] == "30"
    assert store.load().override_set_at == SET_AT
    assert launch_override(_with_expiry(tmp_path, DAY_S), store, SET_AT + DAY_S) == ARGS


def test_a_set_time_that_is_not_a_number_makes_the_state_file_damaged(tmp_path):
    store = StateStore(tmp_path, clock=FakeClock(start_s=0.0))
    store.path.write_text('{"hicache_size_override_gb": 30, "override_set_at": "yesterday"}')
    with capture_logs() as logs:
        assert store.load() == RunState()  # set aside, a fresh state: a damaged file never stops
    assert logs[0]["event"] == "state_corrupt"
    assert "override_set_at" in logs[0]["error"]
    assert RunState.from_json({"override_set_at": 5}).override_set_at == 5
