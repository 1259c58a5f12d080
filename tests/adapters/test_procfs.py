"""Reading server trees from a fake /proc: Rss*, state, titles, escapees, vanished PIDs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.adapters.procfs import INSTANCE_ENV, RUN_ENV, SUPERVISOR_ENV, ProcReader
from supervisor.core.ownership import Owner, whose

KIB = 1024


def write_proc(
    root: Path,
    pid: int,
    *,
    ppid: int,
    pgid: int,
    state: str = "S",
    cmdline: str = "",
    comm: str = "python3",
    anon_kib: int = 0,
    shmem_kib: int = 0,
    file_kib: int = 0,
    threads: int = 1,
    environ: dict[str, str] | None = None,
    start_ticks: int = 1000,
    status: bool = True,
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    # Field 22 is the start time; fields 4 and 5 the ppid and pgrp (proc(5)).
    rest = [state, str(ppid), str(pgid)] + ["0"] * 16 + [str(start_ticks)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + (b"\0" if cmdline else b""))
    if status:
        (d / "status").write_text(
            f"Name:\t{comm}\nState:\t{state} (x)\nThreads:\t{threads}\n"
            f"RssAnon:\t{anon_kib} kB\nRssFile:\t{file_kib} kB\nRssShmem:\t{shmem_kib} kB\n"
        )
    env = environ or {}
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    me = 100  # the supervisor
    write_proc(root, 1, ppid=0, pgid=1, cmdline="/sbin/init")
    write_proc(root, me, ppid=1, pgid=100, cmdline="sglang-supervisor run")
    write_proc(
        root, 200, ppid=me, pgid=200, cmdline="python -m sglang.launch_server --tp 2", anon_kib=1000
    )
    write_proc(
        root,
        201,
        ppid=200,
        pgid=200,
        cmdline="sglang::scheduler_TP0",
        comm="sglang::schedul",
        anon_kib=2000,
        shmem_kib=4000,
        file_kib=9000,
        threads=40,
    )
    write_proc(root, 202, ppid=200, pgid=200, state="Z", cmdline="", comm="sglang::schedul")
    write_proc(root, 203, ppid=200, pgid=200, cmdline="sglang::detokenizer")
    # A setsid escapee reparented to the supervisor, carrying the run marker.
    write_proc(
        root,
        300,
        ppid=me,
        pgid=300,
        cmdline="python orphan",
        environ={RUN_ENV: "run-1", INSTANCE_ENV: "main"},
    )
    write_proc(root, 301, ppid=300, pgid=300, cmdline="python grandchild")
    # Another child of the supervisor that is not the server's (an NVML worker).
    write_proc(root, 400, ppid=me, pgid=400, cmdline="python nvml_worker")
    # Unrelated.
    write_proc(root, 500, ppid=1, pgid=500, cmdline="sshd")
    # Listed but vanished: no status file.
    write_proc(root, 600, ppid=200, pgid=200, cmdline="gone", status=False)
    (root / "vmstat").write_text("nr_free_pages 1\noom_kill 7\n")
    return root


def test_the_tree_is_group_plus_descendants_plus_marked_escapees(proc_root):
    tree = ProcReader(proc_root).server_tree(
        server_pid=200, pgid=200, subreaper_pid=100, run_id="run-1"
    )
    assert [p.pid for p in tree] == [200, 201, 202, 203, 300, 301]


def test_an_escapee_without_the_marker_counts_once_it_was_seen_before(proc_root):
    reader = ProcReader(proc_root)
    tree = reader.server_tree(server_pid=200, pgid=200, subreaper_pid=100, run_id="other")
    assert 300 not in [p.pid for p in tree]
    tree = reader.server_tree(
        server_pid=200, pgid=200, subreaper_pid=100, run_id="other", known_pids={300}
    )
    assert {300, 301} <= {p.pid for p in tree}
    assert 400 not in {p.pid for p in tree}


def test_memory_state_threads_and_titles_are_read(proc_root):
    reader = ProcReader(proc_root)
    rank = reader.read_process(201)
    assert rank is not None
    assert (rank.rss_anon_bytes, rank.rss_shmem_bytes, rank.rss_file_bytes) == (
        2000 * KIB,
        4000 * KIB,
        9000 * KIB,
    )
    assert rank.charged_bytes == 6000 * KIB
    assert rank.threads == 40
    assert rank.title == "sglang::scheduler_TP0"
    zombie = reader.read_process(202)
    assert zombie is not None
    assert zombie.is_zombie
    assert zombie.title == "sglang::schedul"  # no cmdline: the comm is what is left


def test_vanished_and_garbled_processes_are_left_out(proc_root):
    reader = ProcReader(proc_root)
    assert reader.read_process(600) is None
    assert reader.read_process(99999) is None
    (proc_root / "700").mkdir()
    (proc_root / "700" / "stat").write_text("garbage")
    assert reader.read_process(700) is None
    assert reader.processes([201, 600, 99999]) == (reader.read_process(201),)


def test_a_comm_with_spaces_and_parentheses_parses(proc_root):
    write_proc(proc_root, 800, ppid=1, pgid=800, comm="we (ird) name", state="T")
    info = ProcReader(proc_root).read_process(800)
    assert info is not None
    assert (info.state, info.ppid, info.title) == ("T", 1, "we (ird) name")


def _leftovers(reader: ProcReader, instance: str, recorded: dict[int, int] | None = None):
    """The PIDs core.ownership calls ours among the marks this reader scans."""
    return [
        m.pid
        for m in sorted(reader.scan_marks(), key=lambda m: m.pid)
        if whose(m, instance=instance, self_pid=100, self_mark="100:1000", recorded=recorded)
        is Owner.OURS
    ]


def test_leftovers_are_recorded_pids_with_matching_start_time_or_the_instance_marker(proc_root):
    reader = ProcReader(proc_root)
    # 203's start time differs: the PID was reused by another process.
    assert _leftovers(reader, "main", {201: 1000, 203: 999}) == [201, 300]
    assert _leftovers(reader, "other") == []
    assert reader.start_ticks(201) == 1000


def test_oom_kill_counter(proc_root, tmp_path):
    assert ProcReader(proc_root).oom_kill_count() == 7
    assert ProcReader(tmp_path / "nothing").oom_kill_count() is None


def test_the_real_proc_reads_this_process():
    reader = ProcReader()
    me = reader.read_process(os.getpid())
    assert me is not None
    assert me.state in "RS"
    assert me.rss_anon_bytes > 0
    assert "python" in me.title or "pytest" in me.title


def test_marked_processes_of_another_live_supervisor_are_not_leftovers(tmp_path):
    """A second supervisor of the same instance name (another state directory) must not take
    the first one's live server for leftovers; once that supervisor is dead, they are."""
    root = tmp_path / "proc"
    root.mkdir()
    write_proc(root, 1, ppid=0, pgid=1, cmdline="/sbin/init")
    write_proc(root, 500, ppid=1, pgid=500, cmdline="sglang-supervisor run", start_ticks=4242)
    marker = {INSTANCE_ENV: "qwen", SUPERVISOR_ENV: "500:4242"}
    write_proc(root, 501, ppid=500, pgid=501, cmdline="sglang::scheduler_TP0", environ=marker)
    orphan_marker = {INSTANCE_ENV: "qwen", SUPERVISOR_ENV: "600:77"}  # that supervisor is gone
    write_proc(root, 502, ppid=1, pgid=502, cmdline="sglang::scheduler_TP1", environ=orphan_marker)
    reader = ProcReader(root)
    assert _leftovers(reader, "qwen") == [502]
    marks = reader.marks(501)
    assert marks is not None
    assert (marks.instance, marks.launched_by, marks.launcher_alive) == ("qwen", "500:4242", True)
    gone = reader.marks(502)
    assert gone is not None
    assert not gone.launcher_alive
