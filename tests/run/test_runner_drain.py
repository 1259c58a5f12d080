"""A stop's drain, on a fake clock: a clean drain says how long it took; a grace that runs out
with the server alive is a `drain_cut` with SGLang's last count of the requests in flight."""

from __future__ import annotations

import signal
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.core.events import SignalEvent
from supervisor.core.metrics_map import EventMapper, Op, Update
from tests.run.runner_support import LOAD_S, WARM_S, World, names, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")
STOP_AT = LOAD_S + WARM_S + 10.0


def _remaining(count: int) -> str:
    """The line SGLang's main process prints while it drains (tokenizer_manager.py)."""
    rids = ["a1b2"] * count
    return (
        f"[2026-12-01 12:00:00] Gracefully exiting... Remaining number of requests {count}. "
        f"Remaining requests remaining_rids={rids!r}."
    )


def _draining(w: World, prints: dict[float, int], exits_after_s: float | None) -> None:
    """From the stop on, the server ignores SIGTERM as a draining one does, prints its counts
    at STOP_AT + each key, and exits by itself `exits_after_s` after the stop (None: never)."""

    def printing(count: int) -> Callable[[], None]:
        return lambda: w.server.say(_remaining(count))

    def start() -> None:
        w.server.exit_on_term = None
        for after_s, count in prints.items():
            w.events.call_at(STOP_AT + after_s, printing(count))
        if exits_after_s is not None:
            w.events.call_at(STOP_AT + exits_after_s, lambda: w.server.exit_by_itself(0))

    w.events.call_at(STOP_AT - 1.0, start)
    w.events.at(STOP_AT, SIGTERM)


def _event(logs: Sequence[MutableMapping[str, Any]], name: str) -> MutableMapping[str, Any]:
    return next(e for e in logs if e["event"] == name)


def test_a_grace_that_runs_out_is_a_drain_cut_with_sglang_s_last_count(tmp_path: Path):
    w = world(tmp_path)
    _draining(w, {0.5: 2, 1.5: 1}, exits_after_s=None)
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path, stop_grace_s=5.0), watch_gpus=False).run() == 0
    cut = _event(logs, "drain_cut")
    assert cut["log_level"] == "warning"
    assert (cut["grace_s"], cut["remaining_requests"], cut["counted_after_s"]) == (5.0, 1, 1.5)
    assert 5.0 <= cut["drained_s"] < 5.2  # until the grace's end (one 0.1 s poll late at most)
    stopped = _event(logs, "stopped")
    assert stopped["drained_s"] == cut["drained_s"]
    assert stopped["drain"] == "cut_by_grace"  # on its own line too: no clean drain
    assert names(logs)[-2:] == ["stopping", "stopped"]
    mapper = EventMapper(lambda _argv: None)
    assert mapper.feed(cut, mono_s=0.0, wall_s=0.0) == [Update("drains_cut_total", Op.INC)]


def test_a_grace_shorter_than_sglang_s_first_look_cuts_with_no_count(tmp_path: Path):
    w = world(tmp_path)
    _draining(w, {4.0: 1}, exits_after_s=None)  # SGLang looks first up to 5 s after SIGTERM
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path, stop_grace_s=2.0), watch_gpus=False).run() == 0
    cut = _event(logs, "drain_cut")
    assert (cut["remaining_requests"], cut["counted_after_s"]) == (None, None)


def test_a_drain_that_ends_in_time_is_no_cut_and_stopped_says_how_long_it_took(tmp_path: Path):
    w = world(tmp_path)
    _draining(w, {0.5: 1, 2.5: 0}, exits_after_s=3.0)
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path, stop_grace_s=60.0), watch_gpus=False).run() == 0
    assert not [e for e in logs if e["event"] == "drain_cut"]
    stopped = _event(logs, "stopped")
    assert 3.0 <= stopped["drained_s"] < 3.2
    assert stopped["drain"] == "exited"


@pytest.mark.parametrize("second", ["SIGINT", "worker"])
def test_a_second_signal_or_a_worker_node_s_grace_is_no_drain_cut(tmp_path: Path, second: str):
    """A second stop signal is the operator's own cut (`stop_escalated`); a worker node's main
    process does not drain at all (it waits for rank 0's shutdown), so its grace cuts nothing."""
    w = world(tmp_path)
    _draining(w, {0.5: 1}, exits_after_s=None)
    args: tuple[str, ...] = ("--model-path", "m", "--tp", "2")
    if second == "SIGINT":
        w.events.at(STOP_AT + 1.0, SignalEvent(signal.SIGINT, "SIGINT"))
    else:
        args += ("--nnodes", "2", "--node-rank", "1")
    with capture_logs() as logs:
        assert runner(w, settings(tmp_path, args, stop_grace_s=60.0), watch_gpus=False).run() == 0
    assert not [e for e in logs if e["event"] == "drain_cut"]
    stopped = _event(logs, "stopped")
    assert "drained_s" in stopped
    assert stopped["drain"] == ("cut_by_signal" if second == "SIGINT" else "cut_by_grace")
