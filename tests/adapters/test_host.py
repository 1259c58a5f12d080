"""Host facts read from a fake /proc, /sys and cgroup tree built under tmp_path."""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from supervisor.adapters.host import HostProbe, HostReadError, is_port_bound
from supervisor.adapters.sglang_version import installed_sglang_version, interpreter_for
from supervisor.core.shm_space import ShmSpace
from supervisor.core.units import GiB, KiB


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    return tmp_path / "proc", tmp_path / "sys", tmp_path / "cgroup"


def probe_for(roots: tuple[Path, Path, Path]) -> HostProbe:
    proc, sys_root, cgroup = roots
    return HostProbe(proc_root=proc, sys_root=sys_root, cgroup_root=cgroup)


def test_meminfo_reads_total_and_available_in_bytes(roots):
    write(roots[0] / "meminfo", "MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable:  800 kB\n")
    mem = probe_for(roots).read_meminfo()
    assert (mem.total_bytes, mem.available_bytes) == (1000 * KiB, 800 * KiB)


def test_meminfo_without_mem_available_is_an_error_naming_the_file(roots):
    write(roots[0] / "meminfo", "MemTotal: 1000 kB\n")
    with pytest.raises(HostReadError, match="meminfo"):
        probe_for(roots).read_meminfo()
    with pytest.raises(HostReadError, match="cannot read"):
        HostProbe(proc_root=roots[0] / "missing").read_meminfo()


def cgroup_v2(roots, rel: str, files: dict[str, dict[str, str]]) -> None:
    proc, _sys, cg = roots
    write(proc / "self" / "cgroup", f"0::{rel}\n")
    write(cg / "cgroup.controllers", "memory cpu\n")
    for sub, content in files.items():
        for name, text in content.items():
            write(cg / sub / name, text)


def test_cgroup_v2_takes_the_tightest_ancestor_and_ignores_file_pages(roots):
    stat_text = "anon 1\nactive_file 100\ninactive_file 50\n"
    cgroup_v2(
        roots,
        "/system.slice/sglang.service",
        {
            "system.slice": {
                "memory.max": "1000\n",
                "memory.current": "600\n",
                "memory.stat": stat_text,
            },
            "system.slice/sglang.service": {
                "memory.max": "max\n",
                "memory.high": "5000\n",
                "memory.current": "200\n",
                "memory.stat": stat_text,
            },
        },
    )
    reading = probe_for(roots).read_cgroup_headroom()
    # Parent: 1000 − (600 − 150) = 550 beats the child's 5000 − (200 − 150) = 4950.
    assert reading.headroom_bytes == 550
    assert reading.limited_by is not None
    assert reading.limited_by.endswith("system.slice")
    assert reading.warning is None


def test_cgroup_v2_without_any_limit_is_unlimited(roots):
    cgroup_v2(roots, "/user.slice", {"user.slice": {"memory.max": "max\n"}})
    assert probe_for(roots).read_cgroup_headroom().headroom_bytes is None


def test_cgroup_v1_limit_and_unlimited_sentinel(roots):
    proc, _sys, cg = roots
    write(proc / "self" / "cgroup", "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n")
    write(cg / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    write(cg / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "1000\n")
    write(cg / "memory" / "docker" / "abc" / "memory.usage_in_bytes", "700\n")
    write(
        cg / "memory" / "docker" / "abc" / "memory.stat",
        "total_active_file 100\ntotal_inactive_file 100\n",
    )
    assert probe_for(roots).read_cgroup_headroom().headroom_bytes == 500


def test_unreadable_cgroup_files_degrade_to_a_warning(roots):
    cgroup_v2(roots, "/a", {"a": {"memory.max": "lots\n", "memory.current": "1\n"}})
    reading = probe_for(roots).read_cgroup_headroom()
    assert reading.headroom_bytes is None
    assert reading.warning is not None
    assert "unreadable" in reading.warning
    missing = HostProbe(proc_root=roots[0] / "nope").read_cgroup_headroom()
    assert missing.warning is not None


def test_numa_nodes_estimate_available_from_free_and_file_pages(roots):
    sys_root = roots[1]
    node = sys_root / "devices" / "system" / "node"
    write(
        node / "node0" / "meminfo",
        "Node 0 MemTotal: 1000 kB\nNode 0 MemFree: 100 kB\nNode 0 Active(file): 10 kB\n"
        "Node 0 Inactive(file): 20 kB\nNode 0 SReclaimable: 5 kB\n",
    )
    write(node / "node1" / "meminfo", "Node 1 MemTotal: 2000 kB\nNode 1 MemFree: 1500 kB\n")
    (node / "possible").parent.mkdir(parents=True, exist_ok=True)
    write(node / "possible", "0-1\n")
    nodes = probe_for(roots).read_numa_nodes()
    assert [(n.node, n.available_bytes) for n in nodes] == [(0, 135 * KiB), (1, 1500 * KiB)]


def test_numa_meminfo_without_fields_is_an_error_and_no_sysfs_is_no_nodes(roots):
    write(roots[1] / "devices" / "system" / "node" / "node0" / "meminfo", "garbage\n")
    with pytest.raises(HostReadError, match="MemTotal"):
        probe_for(roots).read_numa_nodes()
    assert HostProbe(sys_root=roots[1] / "none").read_numa_nodes() == ()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("Max locked memory         8388608              8388608              bytes", 8388608),
        ("Max locked memory         unlimited            unlimited            bytes", None),
    ],
)
def test_memlock_limit_from_proc_limits(roots, line, expected):
    write(roots[0] / "self" / "limits", f"Limit  Soft Limit  Hard Limit  Units\n{line}\n")
    assert probe_for(roots).read_memlock_limit() == expected


def test_memlock_missing_line_is_an_error(roots):
    write(roots[0] / "self" / "limits", "Max open files 1024 1024 files\n")
    with pytest.raises(HostReadError, match="Max locked memory"):
        probe_for(roots).read_memlock_limit()


def test_hugepages_per_size(roots):
    base = roots[1] / "kernel" / "mm" / "hugepages"
    write(base / "hugepages-1048576kB" / "nr_hugepages", "64\n")
    write(base / "hugepages-1048576kB" / "free_hugepages", "60\n")
    write(base / "hugepages-2048kB" / "nr_hugepages", "0\n")
    write(base / "hugepages-2048kB" / "free_hugepages", "0\n")
    write(base / "stray", "x")
    pages = {h.page_bytes: h for h in probe_for(roots).read_hugepages()}
    assert pages[GiB].free_bytes == 60 * GiB
    assert pages[2048 * KiB].total_pages == 0


def test_shm_size_and_free_space_of_a_real_directory_and_a_missing_one(tmp_path):
    space = HostProbe(shm_path=tmp_path).read_shm()
    assert space is not None
    assert 0 <= space.free_bytes <= space.size_bytes
    assert space.size_bytes > 0
    assert HostProbe(shm_path=tmp_path / "missing").read_shm() is None


def test_a_full_dev_shm_of_normal_size_reads_as_full(tmp_path, monkeypatch):
    """statvfs's f_blocks is the size, f_bavail what is free: only the latter tells it is full."""
    full = os.statvfs_result((4096, 4096, 4 * 1024 * 1024, 0, 0, 1000, 900, 900, 0, 255, 0))
    monkeypatch.setattr(os, "statvfs", lambda _path: full)
    space = HostProbe(shm_path=tmp_path).read_shm()
    assert space == ShmSpace(size_bytes=16 * GiB, free_bytes=0)


def test_device_holders_come_from_fd_symlinks(roots):
    proc = roots[0]
    for pid, targets in {"100": ["/dev/nvidia0", "/dev/nvidiactl"], "200": ["/dev/null"]}.items():
        fd = proc / pid / "fd"
        fd.mkdir(parents=True)
        for i, target in enumerate(targets):
            os.symlink(target, fd / str(i))
    (proc / "300").mkdir()  # a PID whose fd directory vanished
    (proc / "self").mkdir()
    holders = probe_for(roots).read_device_holders()
    assert holders == {100: frozenset({"/dev/nvidia0", "/dev/nvidiactl"})}
    assert probe_for(roots).read_device_holders(exclude_pid=100) == {}


def test_port_bound_is_detected_by_a_bind_attempt():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert is_port_bound("127.0.0.1", port)
    assert not is_port_bound("no-such-host.invalid", port)


def test_interpreter_of_a_command(tmp_path):
    assert interpreter_for(()) == sys.executable
    assert interpreter_for(["/opt/venv/bin/python3", "-m", "sglang.launch_server"]) == (
        "/opt/venv/bin/python3"
    )
    script = write(tmp_path / "sglang", "#!/opt/venv/bin/python3.11\nimport sys\n")
    assert interpreter_for([str(script), "serve"]) == "/opt/venv/bin/python3.11"
    other = write(tmp_path / "tool", "#!/bin/sh\n")
    assert interpreter_for([str(other)]) is None
    assert interpreter_for(["no-such-command-anywhere"]) is None


def test_sglang_version_from_another_interpreter_without_importing_sglang(tmp_path):
    fake = write(tmp_path / "python3", "#!/bin/sh\necho 0.5.9\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert installed_sglang_version(str(fake)) == "0.5.9"
    silent = write(tmp_path / "python3.9", "#!/bin/sh\nexit 0\n")
    silent.chmod(silent.stat().st_mode | stat.S_IXUSR)
    assert installed_sglang_version(str(silent)) is None
    assert installed_sglang_version(str(tmp_path / "missing-python")) is None


def test_sglang_version_for_this_interpreter_reads_metadata_in_process():
    # SGLang is not installed in the test environment: unknown, never an import.
    assert installed_sglang_version(None) is None
    assert "sglang" not in sys.modules


@pytest.mark.parametrize(
    ("cap_eff", "expected"),
    [("00000000a80425fb", False), ("00000000a80465fb", True), ("000001ffffffffff", True)],
)
def test_cap_ipc_lock_is_read_from_the_effective_set(roots, cap_eff, expected):
    # bit 14 is CAP_IPC_LOCK: docker's default set lacks it, `capabilities.add: [IPC_LOCK]` sets it
    write(roots[0] / "self" / "status", f"Name:\tpython\nCapInh:\t0\nCapEff:\t{cap_eff}\n")
    assert probe_for(roots).has_ipc_lock() is expected


def test_no_status_file_means_no_cap_ipc_lock(roots):
    assert probe_for(roots).has_ipc_lock() is False
