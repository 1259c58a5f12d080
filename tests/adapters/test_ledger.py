"""The ledger on disk: two supervisors' entries through the real file and lock, dead entries,
a damaged file, a directory that cannot be had, a lock that is never released."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.adapters import ledger as ledger_mod
from supervisor.adapters.ledger import LEDGER_FILE, LOCK_FILE, Ledger
from supervisor.adapters.procfs import ProcReader

GB = 10**9


def as_pid(book: Ledger, pid: int) -> Ledger:
    """The same ledger seen by another supervisor (a live process of this test run)."""
    book.self_pid = pid
    book.self_ticks = ProcReader().start_ticks(pid) or 0
    return book


def test_another_live_supervisor_s_unpinned_bytes_count_and_its_own_never(tmp_path: Path):
    me = Ledger(tmp_path, "me")
    other = as_pid(Ledger(tmp_path, "other"), os.getppid())
    other.set(planned_bytes=100 * GB, pinned_bytes=30 * GB)
    me.set(planned_bytes=50 * GB)
    seen = me.others()
    assert [(e.instance, e.outstanding_bytes) for e in seen] == [("other", 70 * GB)]
    assert [e.instance for e in other.others()] == ["me"]
    me.drop()
    assert other.others() == ()
    data = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert [e["instance"] for e in data["reservations"]] == ["other"]


def test_the_entry_of_a_supervisor_that_died_is_ignored_and_dropped(tmp_path: Path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = as_pid(Ledger(tmp_path, "dead"), child.pid)
    dead.set(planned_bytes=100 * GB)  # while it still runs
    child.wait()
    me = Ledger(tmp_path, "me")
    assert me.others() == ()
    me.set(planned_bytes=GB)
    data = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert [e["instance"] for e in data["reservations"]] == ["me"]


@pytest.mark.parametrize("content", [b"\xff\xfe not json", b'{"reservations": 5}', b"[]"])
def test_a_damaged_ledger_counts_as_empty_and_is_rewritten(tmp_path: Path, content: bytes):
    (tmp_path / LEDGER_FILE).write_bytes(content)
    me = Ledger(tmp_path, "me")
    assert me.others() == ()
    me.set(planned_bytes=GB)
    data = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert data["reservations"][0]["planned_bytes"] == GB


def test_a_fifo_in_place_of_the_ledger_does_not_hang(tmp_path: Path):
    os.mkfifo(tmp_path / LEDGER_FILE)
    with capture_logs() as logs:
        assert Ledger(tmp_path, "me").others() == ()
    assert [e["event"] for e in logs] == ["ledger_damaged"]


def test_a_read_creates_nothing(tmp_path: Path):
    assert Ledger(tmp_path / "absent", "me").others() == ()
    assert not (tmp_path / "absent").exists()


def test_a_ledger_directory_that_cannot_be_had_is_skipped_with_one_warning(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    me = Ledger(blocker / "ledger", "me")
    with capture_logs() as logs:
        assert me.others() == ()
        me.set(planned_bytes=GB)
        me.drop()
    assert [e["event"] for e in logs] == ["ledger_unavailable"]


def test_a_lock_held_forever_gives_up_after_the_wait(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(ledger_mod, "LOCK_WAIT_S", 0.0)
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    holder = os.open(tmp_path / LOCK_FILE, os.O_RDWR)  # another open file: flock conflicts
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with capture_logs() as logs, Ledger(tmp_path, "me").session() as book:
            assert book.others() == ()
            book.set(planned_bytes=GB)  # a read-only session: nothing written
        assert logs[0]["event"] == "ledger_unavailable"
        assert "locked by another process" in logs[0]["reason"]
        assert not (tmp_path / LEDGER_FILE).exists()
    finally:
        os.close(holder)
        os.close(fd)


def test_links_planted_at_the_ledger_and_its_lock_are_never_followed(tmp_path: Path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    book = tmp_path / "ledger"
    book.mkdir()
    (book / LEDGER_FILE).symlink_to(target)
    with capture_logs() as logs:
        assert Ledger(book, "me").others() == ()
    assert logs[0]["event"] == "ledger_damaged"
    assert "symbolic link" in logs[0]["detail"]
    (book / LOCK_FILE).symlink_to(target)
    with capture_logs() as logs:
        Ledger(book, "me").set(planned_bytes=GB)
    assert [e["event"] for e in logs] == ["ledger_unavailable"]
    assert target.read_text() == "keep me\n"
