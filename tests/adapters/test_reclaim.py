"""adapters.reclaim: pidfd kill + process_mrelease (real processes); states read by procfs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from supervisor.adapters import reclaim
from supervisor.adapters.procfs import ProcReader
from tests.waiting import wait_until


def state_of(pid: int, root: Path = Path("/proc")) -> str | None:
    marks = ProcReader(root).marks(pid)
    return None if marks is None else marks.state


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_kill_and_reclaim_kills_a_live_process_and_reports_a_gone_one():
    proc = _sleeper()
    try:
        assert state_of(proc.pid) in {"R", "S"}
        assert reclaim.kill_and_reclaim(proc.pid)
        assert proc.wait(timeout=10) == -9
        assert state_of(proc.pid) is None
        assert not reclaim.kill_and_reclaim(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_is_reported_as_z_until_reaped():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: state_of(proc.pid) == "Z", what="child to become a zombie")
    finally:
        proc.wait()
    assert state_of(proc.pid) is None


def test_process_mrelease_fails_softly_on_a_live_process():
    proc = _sleeper()
    fd = reclaim.open_pidfd(proc.pid)
    try:
        assert fd is not None
        # EINVAL on a process that is not dying (or ENOSYS before Linux 5.15): never raises.
        assert reclaim.process_mrelease(fd) is False
    finally:
        proc.kill()
        proc.wait()
        if fd is not None:
            assert reclaim.release_memory([fd]) in (0, 1)


def test_the_state_tolerates_hostile_proc_entries(tmp_path: Path):
    (tmp_path / "7").mkdir()
    rest = " ".join(["D", "1", "7"] + ["0"] * 16 + ["4242"])
    (tmp_path / "7" / "stat").write_bytes(f"7 (we (ird) name) {rest}".encode())
    (tmp_path / "7" / "cmdline").write_bytes(b"sglang::scheduler_TP3\0")
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").write_bytes(b"8 (x)")
    assert state_of(7, tmp_path) == "D"
    assert state_of(8, tmp_path) is None
    assert state_of(9, tmp_path) is None
