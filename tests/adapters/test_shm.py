"""Removing what a gone tree left in a shm directory: real files, real PIDs and start times."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.adapters.procfs import ProcReader
from supervisor.adapters.shm import segments, sweep


def dead_process() -> tuple[int, int]:
    """A process of this test that ran and is gone: (pid, start ticks)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    ticks = ProcReader().start_ticks(child.pid)
    assert ticks is not None
    child.communicate(b"")
    return child.pid, ticks


def test_the_segments_of_a_gone_member_go_and_nothing_else(tmp_path: Path):
    pid, ticks = dead_process()
    me = os.getpid()
    my_ticks = ProcReader().start_ticks(me) or 0
    for name in (f"sgl_shm_mq_{pid}_aaaa1111", f"multi_tokenizer_args_{pid}"):
        (tmp_path / name).write_bytes(b"\0" * 8192)
    (tmp_path / f"sgl_shm_mq_{me}_bbbb2222").write_bytes(b"x")  # a live member's
    (tmp_path / f"nccl-{pid}").write_bytes(b"x")  # not SGLang's pid-stamped family
    with capture_logs() as logs:
        removed, freed = sweep({pid: ticks, me: my_ticks}, directory=tmp_path)
    assert (removed, freed) == (2, 16384)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"nccl-{pid}",
        f"sgl_shm_mq_{me}_bbbb2222",
    ]
    assert [e["event"] for e in logs] == ["shm_removed"]


def test_a_segment_older_than_the_member_is_an_earlier_process_s_and_stays(tmp_path: Path):
    pid, ticks = dead_process()
    old = tmp_path / f"sgl_shm_mq_{pid}_cccc3333"
    old.write_bytes(b"x")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))  # mtime before the member started
    assert sweep({pid: ticks}, directory=tmp_path) == (0, 0)
    assert old.exists()


def test_nothing_seen_or_no_directory_is_no_work_and_no_error(tmp_path: Path):
    assert sweep({}, directory=tmp_path) == (0, 0)
    assert sweep({1: 1}, directory=tmp_path / "missing") == (0, 0)
    assert segments(tmp_path / "missing") == ()


def test_a_member_that_is_a_zombie_not_yet_reaped_is_gone(tmp_path: Path):
    """The tree's SIGKILL leaves ranks as zombies until someone reaps them: their segments go
    all the same, whoever reaps first."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = ProcReader().start_ticks(child.pid)
    assert ticks is not None
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie
    (tmp_path / f"sgl_shm_mq_{child.pid}_dddd4444").write_bytes(b"x")
    try:
        assert sweep({child.pid: ticks}, directory=tmp_path) == (1, 1)
    finally:
        child.wait()


HOLDER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
region = mmap.mmap(fd, 4096)
os.close(fd)  # mapped, no longer open: as a semaphore's user holds it
print("mapped", flush=True)
sys.stdin.read()
"""


def test_unstamped_files_of_the_trees_life_go_unless_a_live_process_maps_them(tmp_path: Path):
    """SGLang's load snapshot and a multiprocessing semaphore: no PID in their names, so what
    counts is whether anyone still holds them."""
    pid, ticks = dead_process()
    instance = "4c00ec5647f7"
    digest = hashlib.blake2s(instance.encode(), digest_size=4).hexdigest()
    loads = f"sglang_loads_{instance}_{digest}.shm"
    for name in (loads, "sem.mp-held0000", "sem.mp-free0000"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
        (tmp_path / name).chmod(0o600)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "sem.mp-held0000")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "mapped\n"
        assert sweep({pid: ticks}, directory=tmp_path) == (2, 8192)
        assert [p.name for p in tmp_path.iterdir()] == ["sem.mp-held0000"]
    finally:
        holder.communicate("")
    assert sweep({pid: ticks}, directory=tmp_path) == (1, 4096)  # its holder is gone now
