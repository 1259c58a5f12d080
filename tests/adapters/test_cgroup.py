"""The server tree's cgroup: discovery from /proc/self, the pure-v2 writes against a fake
cgroupfs, and the hybrid path for real (root, cgroup v2 mounted beside v1 memory)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.cgroup import (
    CgroupError,
    CgroupHost,
    InstanceCgroups,
    ServerCgroup,
    discover,
)
from supervisor.adapters.cgroup_dirs import rmdir_group
from tests.cgroups import remove_instance_cgroups
from tests.waiting import wait_until

HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = "6:freezer:/\n4:memory:/process_api/abc\n0::/\n"
PURE_MOUNTS = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
PURE_SELF = "0::/system.slice/sglang-supervisor@qwen.service\n"


def fake_self(tmp_path: Path, mounts: str, own: str) -> Path:
    proc_self = tmp_path / "self"
    proc_self.mkdir()
    (proc_self / "mountinfo").write_text(mounts)
    (proc_self / "cgroup").write_text(own)
    return proc_self


def test_a_hybrid_host_gives_the_v2_group_and_the_v1_memory_group(tmp_path):
    host = discover(fake_self(tmp_path, HYBRID_MOUNTS, HYBRID_SELF))
    assert host.v2_dir == Path("/sys/fs/cgroup/unified")
    assert host.memory_v1_dir == Path("/sys/fs/cgroup/memory/process_api/abc")


def test_a_v1_only_host_is_refused_with_the_reason(tmp_path):
    v1_only = "\n".join(line for line in HYBRID_MOUNTS.splitlines() if "cgroup2" not in line)
    with pytest.raises(CgroupError, match="no cgroup v2 hierarchy mounted"):
        discover(fake_self(tmp_path, v1_only, "4:memory:/x\n"))


def test_a_cgroup_outside_the_mount_is_refused(tmp_path):
    mounts = PURE_MOUNTS.replace(" / /sys/fs/cgroup ", " /other /sys/fs/cgroup ")
    with pytest.raises(CgroupError, match="is not under"):
        discover(fake_self(tmp_path, mounts, PURE_SELF))


@pytest.fixture
def pure_v2(tmp_path: Path) -> CgroupHost:
    """A delegated pure-v2 service cgroup, laid out as the kernel would show it."""
    service = tmp_path / "system.slice" / "svc.service"
    root = service / "sglang-supervisor.qwen"
    for group in (service, root, root / "supervisor", root / "server"):
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.controllers").write_text("cpu io memory pids\n")
        (group / "cgroup.subtree_control").write_text("")
        (group / "cgroup.procs").write_text("")
    (root / "server" / "memory.stat").write_text("anon 1000\nfile 5000\nshmem 300\n")
    (root / "server" / "memory.oom.group").write_text("0\n")
    (root / "server" / "memory.max").write_text("max\n")
    return CgroupHost(v2_dir=service, memory_v1_dir=None)


def test_pure_v2_enables_memory_below_and_sets_oom_group_and_memory_max(pure_v2):
    groups = InstanceCgroups(pure_v2, "qwen")
    server = groups.create(move_self=True, memory_max_bytes=123 * 2**30)
    assert server.mode == "cgroup v2"
    assert (pure_v2.v2_dir / "cgroup.subtree_control").read_text() == "+memory"
    assert (groups.root / "cgroup.subtree_control").read_text() == "+memory"
    assert (server.group / "memory.oom.group").read_text() == "1"
    assert (server.group / "memory.max").read_text() == str(123 * 2**30)
    assert (groups.supervisor / "cgroup.procs").read_text() == str(os.getpid())
    assert server.charged_bytes() == 1300  # anon + shmem; the page cache is not charged
    assert server.join_files == (str(server.group / "cgroup.procs"),)


def test_the_kernels_oom_kills_of_the_tree_are_read_from_its_memory_events(pure_v2):
    server = InstanceCgroups(pure_v2, "qwen").create(move_self=False)
    assert server.oom_kill_count() is None  # no memory.events: unknown, not 0
    events = server.group / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 1\n")
    assert server.oom_kill_count() == 1
    events.write_text("low 0\nhigh 0\n")  # a kernel before 4.13 has no oom_kill line
    assert server.oom_kill_count() is None


def test_a_hybrid_hosts_oom_kills_come_from_the_v1_groups_oom_control(tmp_path: Path):
    v1 = tmp_path / "memory" / "sglang-supervisor.qwen"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    server = ServerCgroup(tmp_path / "unified", v1, v2_memory=False)
    assert server.oom_kill_count() == 3
    assert ServerCgroup(tmp_path / "unified", None, v2_memory=False).oom_kill_count() is None


def test_a_parent_that_refuses_the_controller_leaves_memory_to_proc(pure_v2):
    """v2's no-internal-process rule: a parent with processes cannot enable +memory below."""
    control = pure_v2.v2_dir / "cgroup.subtree_control"
    control.unlink()
    control.mkdir()  # any write fails, as EBUSY would
    server = InstanceCgroups(pure_v2, "qwen").create(move_self=False)
    assert server.mode == "cgroup v2, memory from /proc"
    assert server.charged_bytes() is None


def test_removing_reports_what_could_not_go_and_never_raises(pure_v2):
    groups = InstanceCgroups(pure_v2, "qwen")
    groups.create(move_self=True)
    problems = groups.remove()  # a fake fs: the groups hold files, rmdir fails
    assert problems
    assert (pure_v2.v2_dir / "cgroup.procs").read_text() == str(os.getpid())  # moved back


def real_host() -> CgroupHost:
    if os.geteuid() != 0:
        pytest.skip("cgroups are made by root here")
    try:
        return discover()
    except CgroupError as exc:
        pytest.skip(f"no cgroup v2 here: {exc}")


@pytest.fixture
def real_groups() -> Iterator[tuple[InstanceCgroups, ServerCgroup]]:
    instance = f"test-{uuid.uuid4().hex[:8]}"
    groups = InstanceCgroups(real_host(), instance)
    try:
        yield groups, groups.create(move_self=False)
    finally:
        assert groups.remove() == []
        assert remove_instance_cgroups(instance) == []  # nothing left to clean


def start_in(server: ServerCgroup, code: str) -> subprocess.Popen[bytes]:
    def join() -> None:
        for path in server.join_files:
            with open(path, "w") as fh:
                fh.write("0")

    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=join, start_new_session=True)


ESCAPES = """
import os, time
data = bytearray(8 * 2**20)            # anonymous memory the group is charged for
if os.fork() == 0:
    os.setsid()                        # out of the process group: still in the cgroup
    time.sleep(60)
time.sleep(60)
"""


def test_membership_memory_kill_and_gone_for_real(real_groups):
    _groups, server = real_groups
    proc = start_in(server, ESCAPES)
    try:
        members = wait_until(
            lambda: m if len(m := server.pids()) >= 2 else None, timeout_s=20, what="the fork"
        )
        assert members is not None
        assert proc.pid in members
        assert server.populated()
        charged = server.charged_bytes()
        if server.mode != "cgroup v2, memory from /proc":
            assert charged is not None
            assert charged >= 8 * 2**20
        server.kill()
        assert server.wait_empty(10.0)
        assert server.pids() == []
    finally:
        proc.wait(timeout=10)


def test_a_leftover_in_the_group_is_killed_at_the_next_start(real_groups):
    _groups, server = real_groups
    proc = start_in(server, "import time; time.sleep(60)")
    try:
        assert server.empty_leftovers(10.0) == [proc.pid]
        assert not server.populated()
    finally:
        proc.wait(timeout=10)


class _BusyGroup:
    """A group directory whose rmdir the kernel refuses `busy` times with EBUSY."""

    def __init__(self, tmp_path: Path, busy: int) -> None:
        self.dir = tmp_path / "group"
        self.dir.mkdir()
        self.busy = busy
        self.tries = 0

    def __truediv__(self, name: str) -> Path:
        return self.dir / name  # cgroup.procs: absent, so no member is seen

    def rmdir(self) -> None:
        self.tries += 1
        if self.tries <= self.busy:
            raise OSError(errno.EBUSY, "Device or resource busy")
        self.dir.rmdir()


def test_an_emptied_group_still_busy_for_a_moment_is_removed_on_a_retry(tmp_path: Path):
    group = _BusyGroup(tmp_path, busy=3)
    rmdir_group(group)  # type: ignore[arg-type]  # the duck-typed group stands for a Path
    assert group.tries == 4
    assert not group.dir.exists()


def test_a_group_busy_for_good_is_an_error_after_the_bounded_wait(tmp_path: Path):
    group = _BusyGroup(tmp_path, busy=10**9)
    with pytest.raises(OSError, match="busy"):
        rmdir_group(group, busy_wait_s=0.05)  # type: ignore[arg-type]
    assert group.dir.exists()


def test_a_group_with_a_live_member_is_not_waited_for(tmp_path: Path):
    group = _BusyGroup(tmp_path, busy=10**9)
    (group.dir / "cgroup.procs").write_text(f"{os.getpid()}\n")
    with pytest.raises(OSError, match="busy"):
        rmdir_group(group, busy_wait_s=3600)  # type: ignore[arg-type]
    assert group.tries == 1
