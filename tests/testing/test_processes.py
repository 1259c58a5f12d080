"""The simulated server's process tree and titles, as SGLang 0.5.23 builds them
(supervisor/testing/topology.py, children.py, tokenizers.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from supervisor.testing import gpu_state
from supervisor.testing.args import parse_sim_args
from supervisor.testing.topology import process_plan
from tests.testing.support import FakeServer, post_generate
from tests.waiting import wait_until

DP_TP = ["--tp-size", "2", "--dp-size", "2"]


@pytest.mark.parametrize(
    ("args", "titles"),
    [
        ([], ["sglang::scheduler"]),
        (["--tp", "2"], ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]),
        (
            DP_TP,
            [
                "sglang::scheduler_DP0_TP0",
                "sglang::scheduler_DP0_TP1",
                "sglang::scheduler_DP1_TP0",
                "sglang::scheduler_DP1_TP1",
            ],
        ),
        (
            [*DP_TP, "--enable-dp-attention"],
            ["sglang::scheduler_DP0_TP0", "sglang::scheduler_DP1_TP1"],
        ),
        (
            ["--tp-size", "4", "--attn-dp-size", "2"],
            [
                "sglang::scheduler_DP0_TP0",
                "sglang::scheduler_DP0_TP1",
                "sglang::scheduler_DP1_TP2",
                "sglang::scheduler_DP1_TP3",
            ],
        ),
        (
            ["--tp-size", "2", "--pipeline-parallel-size", "2"],
            [
                "sglang::scheduler_PP0_TP0",
                "sglang::scheduler_PP0_TP1",
                "sglang::scheduler_PP1_TP0",
                "sglang::scheduler_PP1_TP1",
            ],
        ),
        (
            ["--tp-size", "2", "--ep-size", "2"],
            ["sglang::scheduler_TP0_EP0", "sglang::scheduler_TP1_EP1"],
        ),
        (
            ["--tp-size", "4", "--attn-cp-size", "2"],
            [
                "sglang::scheduler_ATTN_CP0_TP0",
                "sglang::scheduler_ATTN_CP0_TP1",
                "sglang::scheduler_ATTN_CP1_TP2",
                "sglang::scheduler_ATTN_CP1_TP3",
            ],
        ),
        (
            ["--tp-size", "4", "--moe-dp-size", "2", "--ep", "2"],
            [
                "sglang::scheduler_MOE_DP0_TP0_EP0",
                "sglang::scheduler_MOE_DP0_TP1_EP1",
                "sglang::scheduler_MOE_DP1_TP2_EP0",
                "sglang::scheduler_MOE_DP1_TP3_EP1",
            ],
        ),
        (  # every part, in SGLang's order; PP is the outer loop of the launch
            [
                *("--tp", "4", "--pp-size", "2", "--attn-dp-size", "2"),
                *("--attn-cp-size", "2", "--moe-dp-size", "2", "--ep", "2"),
            ],
            [
                f"sglang::scheduler_DP{tp // 2}_PP{pp}_ATTN_CP{tp % 2}_MOE_DP{tp // 2}"
                f"_TP{tp}_EP{tp % 2}"
                for pp in range(2)
                for tp in range(4)
            ],
        ),
        (  # MoE-DP narrower than attention CP takes the CP rank
            ["--tp", "8", "--attn-cp-size", "4", "--moe-dp-size", "2"],
            [f"sglang::scheduler_ATTN_CP{tp // 2}_MOE_DP{tp // 2}_TP{tp}" for tp in range(8)],
        ),
    ],
)
def test_scheduler_titles_follow_sglangs_scheme(args, titles):
    plan = parse_sim_args(["--model-path", "m", *args])
    assert [r.title for r in process_plan(plan).ranks] == titles


def test_gpu_of_each_rank_is_base_plus_rank_times_step_and_dp_groups_follow_each_other():
    plan = parse_sim_args(
        ["--model-path", "m", "--tp", "4", "--base-gpu-id", "1", "--gpu-id-step", "2"]
    )
    assert [r.gpu for r in process_plan(plan).ranks] == [1, 3, 5, 7]
    dp = process_plan(parse_sim_args(["--model-path", "m", *DP_TP]))
    assert [r.gpu for r in dp.ranks] == [0, 1, 2, 3]
    assert dp.dp_groups == ((0, 0), (1, 2))


def _children(pid: int) -> dict[str, psutil.Process]:
    out: dict[str, psutil.Process] = {}
    for proc in psutil.Process(pid).children():
        try:
            title = proc.cmdline()[0]
        except (psutil.Error, IndexError):
            continue
        out[title] = proc
    return out


def test_plain_dp_runs_a_controller_that_launches_the_schedulers(start_fake_server, gpu_state_dir):
    server = start_fake_server(DP_TP, state_dir=gpu_state_dir)
    wait_until(lambda: server.status() == 200, what="server up")
    mine = _children(server.proc.pid)
    assert set(mine) >= {"sglang::data_parallel_controller", "sglang::detokenizer"}
    assert not [t for t in mine if t.startswith("sglang::scheduler")]
    controller = mine["sglang::data_parallel_controller"]
    assert sorted(_children(controller.pid)) == [
        "sglang::scheduler_DP0_TP0",
        "sglang::scheduler_DP0_TP1",
        "sglang::scheduler_DP1_TP0",
        "sglang::scheduler_DP1_TP1",
    ]
    log = server.log_text()
    assert "] Launch DP0 starting at GPU #0." in log
    assert "] Launch DP1 starting at GPU #2." in log
    held = {h.gpu_index: h.pid for h in gpu_state.read_holdings(gpu_state_dir)}
    by_title = _children(controller.pid)
    assert held == {
        0: by_title["sglang::scheduler_DP0_TP0"].pid,
        1: by_title["sglang::scheduler_DP0_TP1"].pid,
        2: by_title["sglang::scheduler_DP1_TP0"].pid,
        3: by_title["sglang::scheduler_DP1_TP1"].pid,
    }


def test_attention_dp_schedulers_are_the_main_process_children(start_fake_server):
    server = start_fake_server([*DP_TP, "--enable-dp-attention"])
    wait_until(lambda: server.status() == 200, what="server up")
    mine = _children(server.proc.pid)
    assert {"sglang::scheduler_DP0_TP0", "sglang::scheduler_DP1_TP1"} <= set(mine)
    assert not _children(mine["sglang::data_parallel_controller"].pid)
    assert "Launch DP" not in server.log_text()


def test_a_schedulers_sigquit_kills_the_dp_controller_and_the_watchdog_sees_it(
    start_fake_server,
):
    server = start_fake_server(
        DP_TP,
        scenario={"crash": {"rank": 3, "after_s": 1.0, "exit_code": 1}, "crash_dump_wait_s": 0.1},
    )
    wait_until(lambda: server.status() == 200, what="server up")
    controller = _children(server.proc.pid)["sglang::data_parallel_controller"]
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    # The controller has no SIGQUIT handler: the scheduler's SIGQUIT ends it (-3).
    assert (
        f"Subprocess scheduler_0 (pid={controller.pid}) crashed with exit code -3. "
        "Triggering SIGQUIT for cleanup..." in server.log_text()
    )


def test_a_dp_scheduler_dying_while_loading_fails_the_controller(start_fake_server):
    """The controller's wait for its schedulers raises; its SIGQUIT takes the launch phase."""
    server = start_fake_server(DP_TP, scenario={"exit_code_on_start": 7})
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    log = server.log_text()
    assert "DataParallelController hit an exception: Traceback (most recent call last):" in log
    assert log.index("DataParallelController hit an exception") < log.index(
        "Received sigquit from a child process. It usually means the child failed."
    )


def test_a_dp_scheduler_killed_outright_goes_unnoticed_but_health_fails(start_fake_server):
    server = start_fake_server(DP_TP, scenario={"health_check_timeout_s": 0.5})
    wait_until(lambda: server.status() == 200, what="server up")
    controller = _children(server.proc.pid)["sglang::data_parallel_controller"]
    victim = _children(controller.pid)["sglang::scheduler_DP1_TP0"]
    victim.kill()
    wait_until(lambda: server.status() == 503, what="/health 503")
    assert server.proc.poll() is None
    assert "crashed with exit code" not in server.log_text()


def test_more_detokenizers_come_with_a_router_and_are_watched(start_fake_server):
    server = start_fake_server(["--detokenizer-worker-num", "2"], scenario={"crash_dump_wait_s": 0})
    wait_until(lambda: server.status() == 200, what="server up")
    expected = ["sglang::detokenizer", "sglang::detokenizer", "sglang::detokenizer_router"]

    def detokenizers() -> list[psutil.Process] | None:
        """The titled detokenizers once all three are (else None)."""
        found: list[tuple[str, psutil.Process]] = []
        for child in psutil.Process(server.proc.pid).children():
            with contextlib.suppress(psutil.Error, IndexError):
                if (title := child.cmdline()[0]).startswith("sglang::d"):
                    found.append((title, child))
        return [p for _, p in found] if [t for t, _ in found] == expected else None

    # SGLang waits for its schedulers, not its detokenizers: one may still be titling itself.
    mine = wait_until(detokenizers, what="two detokenizers and their router titled")
    assert mine is not None
    mine[1].kill()
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    assert f"Subprocess detokenizer_1 (pid={mine[1].pid}) crashed with exit code -9." in (
        server.log_text()
    )


@pytest.fixture
def shm_cleanup() -> Iterator[list[int]]:
    """Main PIDs whose /dev/shm/multi_tokenizer_args_<pid> a killed server may leave behind."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        Path(f"/dev/shm/multi_tokenizer_args_{pid}").unlink(missing_ok=True)


def _workers(server: FakeServer) -> dict[str, psutil.Process]:
    return {
        t: p for t, p in _children(server.proc.pid).items() if t.startswith("sglang::tokenizer_")
    }


def _multi(start_fake_server, shm_cleanup, scenario=None) -> FakeServer:
    server: FakeServer = start_fake_server(
        ["--tokenizer-worker-num", "2", "--enable-metrics"], scenario=scenario
    )
    shm_cleanup.append(server.proc.pid)
    wait_until(lambda: len(_workers(server)) == 2, what="two tokenizer workers")
    wait_until(lambda: server.status() == 200, what="server up")
    return server


def test_tokenizer_workers_are_titled_with_their_pid_and_args_go_to_shm(
    start_fake_server, shm_cleanup
):
    server = _multi(start_fake_server, shm_cleanup)
    for title, proc in _workers(server).items():
        assert title == f"sglang::tokenizer_worker:{proc.pid}"
        assert proc.ppid() == server.proc.pid
    assert Path(f"/dev/shm/multi_tokenizer_args_{server.proc.pid}").exists()
    log = server.log_text()
    assert f"INFO:     Started parent process [{server.proc.pid}]" in log
    # /health turns 200 on the first worker's warmup; the second may report a moment later.
    wait_until(
        lambda: len(server.log_lines("INFO:     The server is fired up and ready to roll!")) == 2,
        what="both workers warmed up",
    )


def test_sigterm_in_multi_tokenizer_mode_terminates_the_workers_and_exits_0(
    start_fake_server, shm_cleanup
):
    server = _multi(start_fake_server, shm_cleanup, scenario={"request_s": 2.0})
    workers = list(_workers(server).values())
    with ThreadPoolExecutor(1) as pool:
        request = pool.submit(post_generate, server.port)
        wait_until(lambda: server.running_requests() == 1, what="a request in flight")
        server.proc.send_signal(signal.SIGTERM)
        assert request.result(timeout=30) == 200
    assert server.proc.wait(timeout=30) == 0
    log = server.log_text()
    assert "INFO:     Received SIGTERM, exiting." in log
    for proc in workers:
        assert f"INFO:     Terminated child process [{proc.pid}]" in log
        assert f"kill_process_tree called: parent_pid={proc.pid}, include_parent=False" in log
    assert f"INFO:     Stopping parent process [{server.proc.pid}]" in log
    assert not Path(f"/dev/shm/multi_tokenizer_args_{server.proc.pid}").exists()


def test_a_dead_tokenizer_worker_is_replaced(start_fake_server, shm_cleanup):
    server = _multi(start_fake_server, shm_cleanup)
    victim = next(iter(_workers(server).values()))
    victim.kill()
    wait_until(
        lambda: f"INFO:     Child process [{victim.pid}] died" in server.log_text(),
        what="uvicorn noticing",
    )
    wait_until(lambda: len(_workers(server)) == 2, what="a new worker")
    assert victim.pid not in [p.pid for p in _workers(server).values()]


def test_in_multi_tokenizer_mode_a_crash_sigquit_is_swallowed(start_fake_server, shm_cleanup):
    server = _multi(start_fake_server, shm_cleanup, scenario={"health_check_timeout_s": 0.5})
    rank = _children(server.proc.pid)["sglang::scheduler"]
    rank.kill()
    line = f"Subprocess scheduler_0 (pid={rank.pid}) crashed with exit code -9."
    wait_until(lambda: line in server.log_text(), what="the watchdog's SIGQUIT")
    wait_until(lambda: server.status() == 503, what="/health failing")  # after the SIGQUIT
    assert server.proc.poll() is None
    assert "SIGQUIT received" not in server.log_text()
    assert "Received sigquit" not in server.log_text()


def test_tokenizer_workers_outlive_a_killed_main_process_and_hold_the_port(
    start_fake_server, shm_cleanup
):
    server = _multi(start_fake_server, shm_cleanup)
    workers = list(_workers(server).values())
    server.proc.kill()  # the main process only: uvicorn's workers have no PDEATHSIG
    server.proc.wait(timeout=30)
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
    with socket.socket() as sock, pytest.raises(OSError, match="Address already in use"):
        sock.bind(("127.0.0.1", server.port))
    os.killpg(server.proc.pid, signal.SIGKILL)
    psutil.wait_procs(workers, timeout=10)


def test_each_scheduler_forks_a_child_that_carries_its_title_as_it_initialises(
    start_fake_server, gpu_state_dir
):
    """SGLang's init runs a subprocess (lscpu, nvidia-smi): forked after setproctitle, the
    child has the scheduler's title and the scheduler as its parent until it execs. Here it
    lives long enough to be seen, and the scheduler waits for it as subprocess.run does."""
    server = start_fake_server(["--tp", "2"], {"init_fork_s": 600}, state_dir=gpu_state_dir)

    def forked() -> dict[str, psutil.Process] | None:
        ranks = {t: p for t, p in _children(server.proc.pid).items() if "scheduler" in t}
        found = {t: _children(p.pid).get(t) for t, p in ranks.items()}
        children = {t: c for t, c in found.items() if c is not None}
        return children if len(children) == 2 else None

    children = wait_until(forked, what="each scheduler's forked child")
    assert children is not None
    assert sorted(children) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert server.status() is None  # still initialising: nothing listens yet
    for child in children.values():
        os.kill(child.pid, signal.SIGKILL)  # as its exec would end it: the scheduler goes on
    wait_until(lambda: server.status() == 200, what="server up once the children ended")
    ranks = [p for t, p in _children(server.proc.pid).items() if "scheduler" in t]
    assert all(not r.children() for r in ranks)  # each reaped by its scheduler
