"""The run state file: atomic writes, round trip, corrupt file kept aside, thread-safe update."""

from __future__ import annotations

import dataclasses
import json
import os
import threading

import pytest
from structlog.testing import capture_logs

from supervisor.errors import ConfigError
from supervisor.run.state import STATE_FILE, ProcessRef, RunState, StateStore


def test_missing_file_is_a_fresh_state_and_a_saved_state_round_trips(tmp_path):
    store = StateStore(tmp_path / "inst")
    store.ensure_writable()
    assert store.load() == RunState()
    state = RunState(
        instance="inst",
        run_id="abc",
        restart_count=2,
        restart_times=(1_700_000_000.5, 1_700_000_100.25),
        last_failure="rank_crash",
        server_pids=(ProcessRef(pid=10, start_ticks=99, title="sglang::scheduler_TP0"),),
        gpu_indices=(0, 1),
        hicache_size_override_gb=72,
        override_reason="memory_kill at 3 GB headroom",
    )
    store.save(state)
    loaded = store.load()
    assert dataclasses.replace(loaded, updated_at=None) == state
    assert loaded.updated_at is not None
    assert json.loads(store.path.read_text())["version"] == 1
    assert [p.name for p in store.dir.iterdir()] == ["state.json"]  # no temp files left


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        '{"server_pids": [{"pid": "x"}]}',
        '{"hicache_size_override_gb": -3}',
        '{"restart_count": 1, "bogus_field_from_the_future": 1, "gpu_indices": ["a"]}',
        '{"restart_times": ["yesterday"]}',
        '{"restart_times": [true]}',
    ],
)
def test_a_corrupt_file_is_kept_aside_and_a_fresh_state_used_with_a_warning(tmp_path, text):
    store = StateStore(tmp_path)
    store.path.write_text(text)
    with capture_logs() as logs:
        assert store.load() == RunState()
    kept = list(tmp_path.glob("state.json.corrupt-*"))
    assert len(kept) == 1
    assert kept[0].read_text() == text
    assert not store.path.exists()
    assert logs[0]["event"] == "state_corrupt"
    assert logs[0]["log_level"] == "warning"


def test_unknown_fields_from_a_newer_version_are_ignored(tmp_path):
    store = StateStore(tmp_path)
    store.path.write_text('{"restart_count": 3, "added_later": true}')
    assert store.load().restart_count == 3


def test_concurrent_updates_are_not_lost(tmp_path):
    store = StateStore(tmp_path)

    def bump() -> None:
        for _ in range(20):
            store.update(lambda s: dataclasses.replace(s, restart_count=s.restart_count + 1))

    threads = [threading.Thread(target=bump) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.load().restart_count == 60


def test_try_update_gives_up_while_another_thread_writes_and_can_skip_the_fsyncs(
    tmp_path, monkeypatch
):
    """The watchdog's write right before a SIGKILL: never waits on the run loop's write, nor on
    the disk."""
    store = StateStore(tmp_path)
    held, release = threading.Event(), threading.Event()

    def bigger(state: RunState) -> RunState:
        return dataclasses.replace(state, hicache_size_override_gb=30)

    def slow_change(state: RunState) -> RunState:
        held.set()
        release.wait(10)
        return dataclasses.replace(state, restart_count=1)

    writer = threading.Thread(target=store.update, args=(slow_change,))
    writer.start()
    try:
        assert held.wait(10)
        assert store.try_update(bigger, wait_s=0.01) is None
    finally:
        release.set()
        writer.join()
    assert store.load().hicache_size_override_gb is None
    synced: list[int] = []
    monkeypatch.setattr("os.fsync", lambda fd: synced.append(fd))
    new = store.try_update(bigger, wait_s=1.0, sync=False)
    assert new is not None
    assert new.hicache_size_override_gb == 30
    assert synced == []  # neither the file nor the directory
    assert json.loads(store.path.read_text())["hicache_size_override_gb"] == 30
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    store.update(lambda s: s)
    assert len(synced) == 2  # an ordinary update syncs both


def test_a_file_on_the_state_dirs_path_is_a_config_error_naming_both(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"directory .*file/x cannot be used: .*file on its"):
        StateStore(blocker / "x").ensure_writable()


def test_a_second_supervisor_of_the_same_state_dir_is_refused_naming_the_first(tmp_path):
    """Otherwise it would take the first one's live server for leftovers and kill it."""
    first = StateStore(tmp_path)
    first.ensure_writable()
    first.claim()
    second = StateStore(tmp_path)
    with pytest.raises(ConfigError, match=rf"pid {os.getpid()}\) already supervises"):
        second.claim()


def test_non_utf8_bytes_are_a_corrupt_file_not_a_crash(tmp_path):
    store = StateStore(tmp_path)
    store.path.write_bytes(b'{"run_id": "\xff\xfe"}')
    with capture_logs() as logs:
        assert store.load() == RunState()
    assert logs[0]["event"] == "state_corrupt"
    assert len(list(tmp_path.glob("state.json.corrupt-*"))) == 1


def test_only_the_newest_corrupt_files_are_kept(tmp_path):
    from tests.fakes import FakeClock

    clock = FakeClock()
    store = StateStore(tmp_path, clock=clock, keep_files=3)
    stamps = []
    for _ in range(5):
        store.path.write_text("{not json")
        stamps.append(int(clock.wall()))
        store.load()
        clock.advance(10.0)
    kept = sorted(p.name for p in tmp_path.glob("state.json.corrupt-*"))
    assert kept == [f"state.json.corrupt-{stamp}" for stamp in stamps[2:]]


def test_a_full_disk_keeps_the_state_in_memory_until_a_write_succeeds(tmp_path, monkeypatch):
    from supervisor.atomic_file import write_text_atomic

    store = StateStore(tmp_path)
    store.save(RunState(restart_count=1))

    def full(path: object, text: str, *, sync: bool = True) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("supervisor.run.state.write_text_atomic", full)
    with capture_logs() as logs:
        store.update(lambda s: dataclasses.replace(s, restart_count=2))
        store.update(lambda s: dataclasses.replace(s, hicache_size_override_gb=36))
    assert [e["event"] for e in logs] == ["state_not_saved"]  # said once, not per write
    assert store.load().restart_count == 2  # memory wins over the stale file
    assert store.load().hicache_size_override_gb == 36
    assert json.loads(store.path.read_text())["restart_count"] == 1
    monkeypatch.setattr("supervisor.run.state.write_text_atomic", write_text_atomic)
    with capture_logs() as logs:
        store.update(lambda s: dataclasses.replace(s, restart_count=3))
    assert logs[0]["event"] == "state_saved_again"
    saved = json.loads(store.path.read_text())
    assert (saved["restart_count"], saved["hicache_size_override_gb"]) == (3, 36)


@pytest.mark.timeout(10)
def test_a_fifo_as_the_state_file_is_unreadable_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / STATE_FILE)
    store = StateStore(tmp_path)
    with capture_logs() as logs:
        assert store.load() == RunState()
    assert logs[0]["event"] == "state_unreadable"
    store.save(RunState(restart_count=2))
    assert (tmp_path / STATE_FILE).is_file()
    assert StateStore(tmp_path).load().restart_count == 2


def test_a_state_file_from_before_the_restart_times_loads_with_none(tmp_path):
    """Files written by earlier versions have no restart_times: an empty window, not corrupt."""
    store = StateStore(tmp_path)
    store.path.write_text(json.dumps({"version": 1, "instance": "x", "restart_count": 4}))
    state = store.load()
    assert (state.restart_count, state.restart_times) == (4, ())
    assert not list(tmp_path.glob("state.json.corrupt-*"))
