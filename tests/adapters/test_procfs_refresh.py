"""ProcReader.refresh: known processes re-read from /proc/PID/status alone."""

from __future__ import annotations

from pathlib import Path

from supervisor.adapters.procfs import ProcReader
from supervisor.core.readings import ProcessInfo


def info(pid: int) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=1, pgid=10, state="S", title=f"sglang::scheduler_TP{pid}")


def test_state_and_memory_are_refreshed_title_and_group_kept(tmp_path: Path):
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "status").write_text(
        "Name:\tpython\nState:\tD (disk sleep)\nPPid:\t42\nThreads:\t7\n"
        "RssAnon:\t  2048 kB\nRssFile:\t 4096 kB\nRssShmem:\t 1024 kB\n"
    )
    (tmp_path / "6").mkdir()
    (tmp_path / "6" / "status").write_text("Name:\tzombie\nState:\tZ (zombie)\nPPid:\tnope\n")
    fresh = ProcReader(tmp_path).refresh([info(5), info(6), info(7)])
    assert [p.pid for p in fresh] == [5]  # 6: unparsable, 7: gone
    p = fresh[0]
    assert (p.state, p.ppid, p.threads) == ("D", 42, 7)
    assert (p.rss_anon_bytes, p.rss_shmem_bytes, p.rss_file_bytes) == (2 << 20, 1 << 20, 4 << 20)
    assert p.charged_bytes == 3 << 20
    assert (p.title, p.pgid) == ("sglang::scheduler_TP5", 10)


def test_a_real_process_reads_back(tmp_path: Path):
    import os

    me = ProcReader().refresh([info(os.getpid())])
    assert me
    assert me[0].rss_anon_bytes > 0
    assert me[0].state in ("R", "S")
