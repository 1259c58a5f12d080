"""The load's progress told while `run` supervises: STATUS=, `load_progress` events, the bar;
status.json published for the block's life (run/status_report.py)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from supervisor import log as sup_log
from supervisor.adapters.status_file import STATUS_FILE, StatusPublisher
from supervisor.run.status_report import LoadReporter, publishing_status
from tests.fakes.clock import FakeClock
from tests.fakes.server import RecordingNotifier
from tests.run.runner_support import settings

METER = "Loading safetensors checkpoint shards:  {pct}% Completed | {n}/8 [00:0{n}<00:08,  1.0it/s]"


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """JSON log lines into a buffer, the event tap on."""
    stream = io.StringIO()
    previous = sup_log._format  # what the CLI's error path reads: left as it was found
    sup_log.configure_logging("json", "info", stream=stream)
    try:
        yield stream
    finally:
        structlog.reset_defaults()
        sup_log._format = previous


def events(stream: io.StringIO, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [e for e in found if e.get("event") == name]


def world(tmp_path: Path, *, bar: bool = False):
    clock = FakeClock()
    publisher = StatusPublisher(
        tmp_path,
        instance="unit",
        restart_window_s=1800.0,
        wall=clock.wall,
        monotonic=clock.monotonic,
    )
    notifier = RecordingNotifier()
    return clock, publisher, notifier, LoadReporter(publisher, notifier, clock, bar=bar)


def load(publisher: StatusPublisher, n: int) -> None:
    publisher.feed({"event": "server_output", "line": METER.format(pct=n * 100 // 8, n=n)})


def test_while_loading_systemd_sees_the_progress_and_the_log_gets_it_every_10_s(
    tmp_path: Path, logged: io.StringIO
):
    clock, publisher, notifier, reporter = world(tmp_path)
    publisher.feed({"event": "launching", "run_id": "r1", "argv": [], "restart_count": 0})
    publisher.feed({"event": "server_launched", "pid": 77})
    publisher.feed({"event": "loading"})
    reporter.tick()  # the launch is seen: nothing told yet
    load(publisher, 1)
    clock.advance(1)
    reporter.tick()
    assert notifier.messages == []  # under 2 s since the launch
    clock.advance(1)
    reporter.tick()
    assert notifier.messages == [
        "STATUS=loading (loading weights 12% (1/8 shards, ETA 6 s)); restarts 0; run r1"
    ]
    clock.advance(1)
    reporter.tick()  # no move: no new STATUS=
    assert len(notifier.messages) == 1
    assert events(logged, "load_progress") == []
    for _ in range(7):
        clock.advance(1)
        reporter.tick()
    told = events(logged, "load_progress")
    assert len(told) == 1  # ten seconds after the launch
    assert told[0]["phase"] == "weights"
    assert (told[0]["done"], told[0]["total"], told[0]["percent"]) == (1, 8, 12.5)
    assert (told[0]["run_id"], told[0]["server_pid"]) == ("r1", 77)  # from another thread
    assert told[0]["detail"].startswith("loading weights 12%")
    assert len(notifier.messages) == 1
    for _ in range(2):
        clock.advance(1)
        reporter.tick()
    assert len(notifier.messages) == 2  # STATUS= again 10 s after the last, moved or not


def test_once_ready_nothing_more_is_told(tmp_path: Path, logged: io.StringIO):
    clock, publisher, notifier, reporter = world(tmp_path)
    publisher.feed({"event": "launching", "run_id": "r1", "argv": []})
    reporter.tick()
    load(publisher, 4)
    publisher.feed({"event": "ready"})
    for _ in range(12):
        clock.advance(1)
        reporter.tick()
    assert notifier.messages == []
    assert events(logged, "load_progress") == []


def test_on_a_terminal_the_progress_is_a_bar_line_while_it_moves(
    tmp_path: Path, logged: io.StringIO
):
    clock, publisher, _notifier, reporter = world(tmp_path, bar=True)
    publisher.feed({"event": "launching", "run_id": "r1", "argv": []})
    reporter.tick()
    for n in range(1, 5):
        load(publisher, n)
        clock.advance(1)
        reporter.tick()
    for _ in range(5):  # no more progress: no more bars
        clock.advance(1)
        reporter.tick()
    bars = [e["bar"] for e in events(logged, "load_progress")]
    assert bars == [
        "[######------------------] loading weights 25% (2/8 shards, ETA 7 s)",
        "[############------------] loading weights 50% (4/8 shards, ETA 7 s)",
    ]


def test_the_block_publishes_its_status_and_an_internal_error_ends_it_failed(
    tmp_path: Path, logged: io.StringIO
):
    run_settings = settings(tmp_path)
    notifier = RecordingNotifier()
    seen: list[str] = []

    def a_run_with_a_bug() -> None:
        with publishing_status(run_settings, notifier):
            seen.append(json.loads((tmp_path / STATUS_FILE).read_text())["state"])
            structlog.get_logger("t").info("launching", run_id="r1", argv=["--tp", "2"])
            seen.append(json.loads((tmp_path / STATUS_FILE).read_text())["state"])
            raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        a_run_with_a_bug()
    assert seen == ["starting", "launching"]
    written = json.loads((tmp_path / STATUS_FILE).read_text())
    assert (written["state"], written["exit_code"]) == ("failed", 70)
    structlog.get_logger("t").info("ready")  # the sink is gone with the block
    assert json.loads((tmp_path / STATUS_FILE).read_text())["state"] == "failed"
