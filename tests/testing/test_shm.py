"""The simulated server's /dev/shm segments, named, kept and swept as SGLang 0.5.23 does
(supervisor/testing/shm.py). Real servers; every wait is on what the server shows."""

from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from supervisor.testing import shm
from supervisor.testing.args import parse_sim_args
from supervisor.testing.layout import GB
from supervisor.testing.tokenizers import shm_name
from supervisor.testing.topology import process_plan
from tests.testing.support import TEST_BYTES_PER_GB, FakeServer, recorded_shm_names, shm_names_of
from tests.waiting import wait_until

MQ_NAME = re.compile(r"^sgl_shm_mq_(\d+)_[0-9a-f]{8}$")


def _dead_pid() -> int:
    """A PID no process can have: PIDs stay below pid_max (os.kill answers ESRCH)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def _up(server: FakeServer) -> None:
    wait_until(lambda: server.status() == 200, what="server up (/health 200)")


def _rank(server: FakeServer, title: str) -> psutil.Process:
    return server.titled()[title]


def test_a_name_carries_its_creators_pid_where_sglangs_sweep_reads_it():
    name = shm.make_shm_name("mq")
    assert MQ_NAME.match(name)
    assert shm.creator_pid(name) == os.getpid()
    assert shm.creator_pid(shm_name(4242)) == 4242  # the main process's multi-tokenizer args


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        ("sgl_shm_mq_123_0a1b2c3d", 123),
        ("sgl_shm_nodecheck_7_ffffffff", 7),
        ("sgl_shm_some_kind_55_0a1b2c3d", 55),  # a kind with "_": the pid is second to last
        ("sgl_shm_mq_abc_0a1b2c3d", None),
        ("sgl_shm_mq_0_0a1b2c3d", None),  # os.kill(0, ...) would probe a process group
        ("sgl_shm_mq_-1_0a1b2c3d", None),
        ("sgl_shm_x", None),
        ("multi_tokenizer_args_4242", 4242),
        ("multi_tokenizer_args_x", None),
        ("nccl-123", None),
        ("sglang_loads_model_1.shm", None),
        ("psm_123", None),
    ],
)
def test_creator_pid_follows_sglangs_rule(name, pid):
    assert shm.creator_pid(name) == pid


def test_the_sweep_removes_pid_stamped_files_of_dead_creators_only(tmp_path):
    dead, live = _dead_pid(), os.getppid()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: psutil.Process(zombie.pid).status() == "zombie", what="a zombie")
        names = {
            f"sgl_shm_mq_{dead}_0a1b2c3d": False,
            f"multi_tokenizer_args_{dead}": False,
            f"sgl_shm_mq_{live}_0a1b2c3d": True,
            f"sgl_shm_mq_{os.getpid()}_0a1b2c3d": True,  # the sweeper's own
            f"sgl_shm_mq_{zombie.pid}_0a1b2c3d": True,  # os.kill(zombie, 0) succeeds
            # SGLang removes these pid-less families unconditionally; the simulation does not.
            "nccl-0": True,
            "cuda.shm.0": True,
            "sem.loky-0": True,
            "sglang_loads_model_1.shm": True,
            "unrelated": True,
        }
        for name in names:
            (tmp_path / name).write_bytes(b"x" * 10)
        assert shm.sweep_stale(tmp_path) == (2, 20)
        assert {p.name for p in tmp_path.iterdir()} == {n for n, kept in names.items() if kept}
    finally:
        zombie.wait()


@pytest.mark.parametrize(
    ("args", "broadcasts"),
    [
        ([], [()]),
        (["--tp", "2"], [(1,), ()]),
        (["--tp", "2", "--dp-size", "2"], [(1,), (), (1,), ()]),
        # Attention TP groups {0,1} {2,3} under the TP group: rank 0 writes two.
        (["--tp", "4", "--attn-dp-size", "2"], [(3, 1), (), (1,), ()]),
        # Attention TP {0-3} {4-7}, attention CP {0,4} {1,5} {2,6} {3,7}.
        (["--tp", "8", "--attn-cp-size", "2"], [(7, 3, 1), (1,), (1,), (1,), (3,), (), (), ()]),
        # A TP group split over two nodes: no reader beside the writer, so no ring buffer.
        (["--tp", "2", "--nnodes", "2", "--node-rank", "0"], [(0,)]),
        (["--tp", "4", "--nnodes", "2", "--node-rank", "1"], [(), ()]),
        (["--tp", "2", "--pp-size", "2", "--nnodes", "2", "--node-rank", "1"], [(1,), ()]),
    ],
)
def test_broadcaster_writers_and_their_readers_on_the_node(args, broadcasts):
    plan = process_plan(parse_sim_args(["--model-path", "m", *args]))
    assert [r.broadcasts for r in plan.ranks] == broadcasts


def test_a_tp2_server_makes_a_ring_buffer_on_rank_0_and_a_clean_stop_unlinks_it(
    start_fake_server, shm_record
):
    server = start_fake_server(["--tp-size", "2"])
    _up(server)
    tp0, tp1 = _rank(server, "sglang::scheduler_TP0"), _rank(server, "sglang::scheduler_TP1")
    (name,) = shm_names_of(tp0.pid)
    assert MQ_NAME.match(name)
    assert shm.creator_pid(name) == tp0.pid
    assert (shm.SHM_DIR / name).stat().st_size == math.ceil(
        shm.mq_bytes(1) * TEST_BYTES_PER_GB / GB
    )
    assert shm_names_of(tp1.pid) == []
    # The node check came first and is gone already (unlinked after the group's barrier).
    (probe,) = [n for n in recorded_shm_names(shm_record) if "_nodecheck_" in n]
    assert shm.creator_pid(probe) == tp0.pid
    assert not (shm.SHM_DIR / probe).exists()
    server.proc.send_signal(signal.SIGTERM)  # after the warmup: drain, ShutdownReq, exit 0
    assert server.proc.wait(timeout=30) == 0
    assert not (shm.SHM_DIR / name).exists()


def test_a_sigkilled_tree_leaks_its_segments_and_only_shm_sweep_removes_them(start_fake_server):
    first = start_fake_server(["--tp-size", "2"])
    _up(first)
    creator = _rank(first, "sglang::scheduler_TP0").pid
    (leaked,) = shm_names_of(creator)
    os.killpg(first.proc.pid, signal.SIGKILL)  # the tree, resource tracker included
    first.proc.wait(timeout=30)
    wait_until(lambda: not psutil.pid_exists(creator), what="the creator gone")
    assert (shm.SHM_DIR / leaked).exists()
    ours = shm.SHM_DIR / shm.make_shm_name("test")  # a live creator: this process
    ours.write_bytes(b"x")
    try:
        second = start_fake_server(["--tp-size", "2"])  # SGLang's server never sweeps
        _up(second)
        assert (shm.SHM_DIR / leaked).exists()
        third = start_fake_server(["--tp-size", "2"], scenario={"shm_sweep": True})
        _up(third)
        assert not (shm.SHM_DIR / leaked).exists()
        assert ours.exists()
        live = _rank(second, "sglang::scheduler_TP0").pid
        assert len(shm_names_of(live)) == 1  # a live server's segment stays
        (line,) = third.log_lines("cleanup_stale_shm:")
        assert re.search(
            r"\] cleanup_stale_shm: removed \d+ stale segment\(s\), freed \d+\.\d MiB$", line
        )
        assert third.log_text().index(line) < third.log_text().index("Load weight begin")
    finally:
        ours.unlink(missing_ok=True)


def test_a_sigkill_of_the_main_process_alone_lets_the_resource_tracker_unlink(start_fake_server):
    server = start_fake_server(["--tp-size", "2"])
    _up(server)
    (name,) = shm_names_of(_rank(server, "sglang::scheduler_TP0").pid)
    server.proc.kill()  # the ranks follow by PDEATHSIG; the tracker outlives them, then cleans
    server.proc.wait(timeout=30)
    wait_until(lambda: not (shm.SHM_DIR / name).exists(), what="the tracker unlinking it")
    wait_until(
        lambda: "leaked shared_memory objects to clean up at shutdown" in server.log_text(),
        what="the tracker's warning",
    )


@pytest.mark.parametrize(
    ("args", "scenario", "env", "counts"),
    [
        ([], {"shm_segments": 2}, {}, {"sglang::scheduler": 2}),
        (["--tp", "2"], {"shm_segments": 0}, {}, {"sglang::scheduler_TP0": 0}),
        (["--tp", "2"], {"shm_segments": 1}, {}, {"sglang::scheduler_TP1": 0}),
        (
            ["--tp", "2"],
            {},
            {"SGLANG_USE_MESSAGE_QUEUE_BROADCASTER": "false"},
            {"sglang::scheduler_TP0": 0},
        ),
    ],
)
def test_segment_counts_follow_the_scenario_and_sglangs_switch(
    start_fake_server, monkeypatch, args, scenario, env, counts
):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    server = start_fake_server(args, scenario=scenario)
    _up(server)
    for title, count in counts.items():
        names = shm_names_of(_rank(server, title).pid)
        assert len(names) == count
        assert all(MQ_NAME.match(n) for n in names)


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_first_rank_writes_the_load_snapshot_and_no_exit_unlinks_it(
    start_fake_server, shm_record
):
    """managers/load_snapshot.py: one file per server, named after its instance id, mapped by
    its writer for life, left behind by a clean stop too."""
    server = start_fake_server(["--tp-size", "2"])
    _up(server)
    (name,) = [n for n in recorded_shm_names(shm_record) if n.startswith("sglang_loads_")]
    instance, digest = name.removeprefix("sglang_loads_").removesuffix(".shm").split("_")
    assert len(instance) == 12
    assert hashlib.blake2s(instance.encode(), digest_size=4).hexdigest() == digest
    path = shm.SHM_DIR / name
    assert path.stat().st_size == 12 + 16 * 1024  # one DP rank
    assert path.read_bytes()[:4] == b"SLNS"
    tp0, tp1 = _rank(server, "sglang::scheduler_TP0"), _rank(server, "sglang::scheduler_TP1")
    assert str(path) in _maps(tp0.pid)
    assert str(path) not in _maps(tp1.pid)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert path.exists()  # SGLang never unlinks it (the test's teardown does)


def test_the_loading_bars_rank_holds_a_semaphore_that_only_a_clean_exit_unlinks(
    start_fake_server, shm_record
):
    """tqdm's multiprocessing lock in a spawn process: /dev/shm/sem.mp-*, mapped by its rank."""
    first = start_fake_server(["--tp-size", "2"])
    _up(first)
    (name,) = [n for n in recorded_shm_names(shm_record) if n.startswith("sem.mp-")]
    # glibc maps a temporary file it then links under the name: compare the inode.
    inode = (shm.SHM_DIR / name).stat().st_ino
    maps = _maps(_rank(first, "sglang::scheduler_TP0").pid).splitlines()
    assert any(line.split()[4] == str(inode) for line in maps if "/dev/shm/" in line)
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(timeout=30) == 0
    assert not (shm.SHM_DIR / name).exists()
