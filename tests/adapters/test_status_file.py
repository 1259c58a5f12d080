"""status.json: written atomically as events come, throttled, read back by another process."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from supervisor.adapters.status_file import (
    STATUS_FILE,
    StatusPublisher,
    lock_held,
    read_status,
    recorded_pid,
)
from supervisor.run.state import LOCK_FILE, StateStore

WALL_S = 1_800_000_000.0


class Clocks:
    def __init__(self) -> None:
        self.mono = 100.0

    def wall(self) -> float:
        return WALL_S + self.mono

    def monotonic(self) -> float:
        return self.mono


def publisher(tmp_path: Path, clocks: Clocks) -> StatusPublisher:
    return StatusPublisher(
        tmp_path,
        instance="qwen",
        restart_window_s=1800.0,
        wall=clocks.wall,
        monotonic=clocks.monotonic,
    )


def on_disk(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / STATUS_FILE).read_text())
    return data


LINE = "Loading safetensors checkpoint shards:  {pct}% Completed | {n}/8 [00:0{n}<00:04,  1.0it/s]"


def meter(n: int) -> dict[str, Any]:
    return {"event": "server_output", "line": LINE.format(pct=n * 100 // 8, n=n)}


def test_state_changes_are_written_at_once_and_the_rest_at_most_every_two_seconds(
    tmp_path: Path,
):
    clocks = Clocks()
    pub = publisher(tmp_path, clocks)
    pub.flush()  # the first flush writes "starting"
    assert on_disk(tmp_path)["state"] == "starting"
    pub.feed({"event": "launching", "run_id": "r1", "argv": ["--tp", "2"]})
    assert on_disk(tmp_path)["state"] == "launching"
    pub.feed(meter(1))  # a new phase: written at once
    assert on_disk(tmp_path)["load_progress"]["done"] == 1
    clocks.mono += 0.5
    pub.feed(meter(2))  # the same phase, 0.5 s later: held back
    assert on_disk(tmp_path)["load_progress"]["done"] == 1
    pub.flush()
    assert on_disk(tmp_path)["load_progress"]["done"] == 1
    clocks.mono += 1.5
    pub.flush()  # two seconds after the last write: what was held back goes out
    assert on_disk(tmp_path)["load_progress"]["done"] == 2
    clocks.mono += 2.5
    pub.feed(meter(3))  # more than two seconds since the last write: at once
    assert on_disk(tmp_path)["load_progress"]["done"] == 3
    pub.feed(meter(4))
    pub.close()  # the end of the run: whatever changed is written
    assert on_disk(tmp_path)["load_progress"]["done"] == 4
    assert pub.snapshot().load is not None


def test_a_server_line_is_parsed_without_the_lock_the_other_threads_events_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The output pump's thread folds its line (the load meter's parse) before it takes the
    lock; another event folded in meanwhile makes it fold again under the lock."""
    from supervisor.adapters import status_file
    from supervisor.core import status

    pub = publisher(tmp_path, Clocks())
    pub.feed({"event": "launching", "run_id": "r1", "argv": []})
    held_while_folding: list[bool] = []
    real_fold = status.fold

    def fold(seen: Any, event: Any, now_s: float) -> Any:
        held_while_folding.append(pub._lock.locked())
        if len(held_while_folding) == 1:  # another thread's event lands in between
            pub._status = real_fold(seen, {"event": "loading"}, now_s)
        return real_fold(seen, event, now_s)

    monkeypatch.setattr(status_file, "fold", fold)
    pub.feed(meter(3))
    assert held_while_folding == [False, True]
    snapshot = pub.snapshot()
    assert snapshot.server_state == "loading"  # the event in between is kept
    assert snapshot.load is not None
    assert snapshot.load.done == 3


def test_an_unwritable_directory_counts_an_error_and_never_raises(tmp_path: Path):
    pub = publisher(tmp_path / "gone", Clocks())
    pub.feed({"event": "launching", "run_id": "r1", "argv": []})
    pub.close()
    assert pub.errors == 2
    assert pub.snapshot().state == "launching"


def test_events_that_change_nothing_do_not_write(tmp_path: Path):
    pub = publisher(tmp_path, Clocks())
    pub.feed({"event": "memory_report", "available_bytes": 1})
    assert not (tmp_path / STATUS_FILE).exists()


def test_the_file_reads_back_as_the_status(tmp_path: Path):
    pub = publisher(tmp_path, Clocks())
    pub.feed({"event": "launching", "run_id": "r1", "argv": ["--tp", "2"]})
    status, problem = read_status(tmp_path / STATUS_FILE)
    assert problem is None
    assert status == pub.snapshot()
    assert status is not None
    assert status.supervisor_pid == os.getpid()
    assert status.supervisor_start_ticks is not None


def test_a_missing_corrupt_or_odd_status_file_is_told_not_raised(tmp_path: Path):
    assert read_status(tmp_path / STATUS_FILE) == (None, None)
    (tmp_path / STATUS_FILE).write_text('{"state": "rea')
    status, problem = read_status(tmp_path / STATUS_FILE)
    assert status is None
    assert problem is not None
    assert "is corrupt" in problem
    (tmp_path / STATUS_FILE).write_bytes(b"\xff\xfe")
    assert "is corrupt" in (read_status(tmp_path / STATUS_FILE)[1] or "")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    status, problem = read_status(fifo)  # a FIFO nobody writes: told at once, no hang
    assert status is None
    assert "not a regular file" in (problem or "")


def test_the_lock_tells_whether_a_supervisor_holds_the_directory(tmp_path: Path):
    assert not lock_held(tmp_path / LOCK_FILE)
    assert recorded_pid(tmp_path / LOCK_FILE) is None
    store = StateStore(tmp_path)
    store.claim()
    try:
        assert lock_held(tmp_path / LOCK_FILE)
        assert recorded_pid(tmp_path / LOCK_FILE) == os.getpid()
    finally:
        store.release()
    assert not lock_held(tmp_path / LOCK_FILE)
    again = StateStore(tmp_path)
    again.claim()  # the probe gave the lock back: a supervisor can still claim it
    again.release()


def test_status_json_is_0640_the_one_file_a_group_the_operator_chose_may_read(tmp_path: Path):
    publisher(tmp_path, Clocks()).feed({"event": "launching", "run_id": "r1", "argv": []})
    assert stat.S_IMODE((tmp_path / STATUS_FILE).stat().st_mode) == 0o640


def test_a_link_planted_at_status_json_is_replaced_and_never_read_through(tmp_path: Path):
    target = tmp_path / "precious.json"
    (tmp_path / "other").mkdir()
    other = publisher(tmp_path / "other", Clocks())  # a real status of someone else's
    other.feed({"event": "launching", "run_id": "theirs", "argv": []})
    target.write_text((tmp_path / "other" / STATUS_FILE).read_text())
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / STATUS_FILE).symlink_to(target)
    status, problem = read_status(state_dir / STATUS_FILE)
    assert status is None
    assert "symbolic link" in (problem or "")
    (state_dir / LOCK_FILE).symlink_to(target)
    assert recorded_pid(state_dir / LOCK_FILE) is None
    assert not lock_held(state_dir / LOCK_FILE)
    before = target.read_text()
    publisher(state_dir, Clocks()).feed({"event": "launching", "run_id": "ours", "argv": []})
    assert target.read_text() == before
    assert not (state_dir / STATUS_FILE).is_symlink()
    assert json.loads((state_dir / STATUS_FILE).read_text())["run_id"] == "ours"
