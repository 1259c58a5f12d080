"""Each failure scenario of the simulated server produces the observable state it promises."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from supervisor.testing import gpu_state
from tests.testing.support import FakeServer, stranger_on
from tests.waiting import wait_until


def _status_line(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def _rank(server: FakeServer, title: str = "sglang::scheduler") -> psutil.Process:
    wait_until(lambda: title in server.titled(), what=f"{title} running")
    return server.titled()[title]


def _up(server: FakeServer) -> None:
    wait_until(lambda: server.status() == 200, what="server up (/health 200)")


def test_leak_grows_one_ranks_anonymous_memory_up_to_max_bytes(start_fake_server):
    leak = {"rank": 1, "bytes_per_s": 64 << 20, "after_s": 0, "max_bytes": 8 << 20}
    server = start_fake_server(["--tp-size", "2"], scenario={"leak": leak})
    _up(server)
    leaking = server.titled()["sglang::scheduler_TP1"]
    steady = server.titled()["sglang::scheduler_TP0"]
    wait_until(
        lambda: (
            _status_line(leaking.pid, "RssAnon") - _status_line(steady.pid, "RssAnon")
            >= (8 << 20) * 0.95
        ),
        what="TP1 RssAnon 8 MiB above TP0",
    )


def test_shmem_leak_shows_as_rss_shmem(start_fake_server):
    leak = {"rank": 0, "bytes_per_s": 64 << 20, "max_bytes": 4 << 20, "kind": "shmem"}
    server = start_fake_server(scenario={"leak": leak})
    rank = _rank(server)
    wait_until(lambda: _status_line(rank.pid, "RssShmem") >= 4 << 20, what="RssShmem 4 MiB")


def test_zombie_rank_stays_unreaped_and_health_fails(start_fake_server):
    server = start_fake_server(
        ["--tp-size", "2"],
        scenario={"zombie": {"rank": 1, "after_s": 0.3}, "health_check_timeout_s": 0.3},
    )
    _up(server)
    rank = server.titled()["sglang::scheduler_TP1"]
    wait_until(lambda: rank.status() == psutil.STATUS_ZOMBIE, what="TP1 in state Z")
    wait_until(lambda: server.status() == 503, what="/health 503 with a silent rank")
    assert server.proc.poll() is None  # the main process never noticed


def test_hang_stops_the_rank_and_health_turns_503(start_fake_server):
    server = start_fake_server(
        scenario={"hang": {"rank": 0, "after_s": 0.3}, "health_check_timeout_s": 0.3}
    )
    _up(server)
    rank = server.titled()["sglang::scheduler"]
    wait_until(lambda: rank.status() == psutil.STATUS_STOPPED, what="rank in state T")
    wait_until(lambda: server.status() == 503, what="/health 503 with a stopped rank")
    # /ready does not probe the ranks, but the failed health check marked the server UnHealthy.
    assert server.status("/ready") == 503
    assert "Health check failed. Server couldn't get a response from detokenizer" in (
        server.log_text()
    )


def test_health_fail_after_answers_503(start_fake_server):
    server = start_fake_server(scenario={"health_fail_after_s": 0.3})
    _up(server)
    wait_until(lambda: server.status() == 503, what="/health 503 after health_fail_after_s")
    assert server.status("/health_generate") == 503


def test_health_fail_no_answer_leaves_the_request_hanging(start_fake_server):
    server = start_fake_server(
        scenario={"health_fail_after_s": 0.2, "health_fail_mode": "no_answer"}
    )
    _up(server)

    def times_out() -> bool:
        try:
            server.status(timeout_s=0.3)
        except TimeoutError:
            return True
        return False

    wait_until(times_out, what="/health without an answer")


def test_ignore_sigterm_keeps_serving_until_sigkill(start_fake_server):
    server = start_fake_server(scenario={"ignore_sigterm": True})
    _up(server)
    server.proc.send_signal(signal.SIGTERM)
    server.proc.send_signal(signal.SIGINT)
    # Wait for something observable after the signals: a fresh health answer still 200.
    assert server.status() == 200
    assert server.proc.poll() is None
    assert "SIGTERM received" not in server.log_text()
    # Its children keep SGLang's dispositions: a SIGTERM kills a rank (the watchdog reports it).
    rank = server.titled()["sglang::scheduler"]
    rank.send_signal(signal.SIGTERM)
    wait_until(
        lambda: f"(pid={rank.pid}) crashed with exit code -15." in server.log_text(),
        what="the rank killed by SIGTERM",
    )
    os.killpg(server.proc.pid, signal.SIGKILL)
    assert server.proc.wait(timeout=10) == -signal.SIGKILL


def test_ranks_die_with_the_main_process(start_fake_server):
    server = start_fake_server(["--tp-size", "2"])
    _up(server)
    children = server.tree()
    server.proc.kill()  # only the main process: the ranks follow by PR_SET_PDEATHSIG
    server.proc.wait(timeout=10)
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_exit_code_on_start_dies_while_loading(start_fake_server):
    """engine.py _wait_for_scheduler_ready raises; launch_server.py kills the rest: exit 1."""
    server = start_fake_server(scenario={"exit_code_on_start": 7, "startup_s": 0.2})
    assert server.proc.wait(timeout=20) == 1
    log = server.log_text()
    assert "RuntimeError: Rank 0 scheduler died during initialization (exit code: 7)" in log
    assert "kill_process_tree called:" in log


def test_a_port_held_by_a_server_that_answers_is_warmed_up_there_fired_up_and_exit_3(
    start_fake_server, free_port
):
    """SGLang's warm-up thread runs although its bind failed: it reaches the other server,
    calls itself fired up, and uvicorn still exits 3 (STARTUP_FAILURE)."""
    with stranger_on(free_port) as seen:
        server = start_fake_server(port=free_port)
        assert server.proc.wait(timeout=30) == 3
    log = server.log_text()
    assert "address already in use" in log
    assert "The server is fired up and ready to roll!" in log
    assert log.index("address already in use") < log.index("fired up")
    assert {"GET /model_info", "POST /generate"} <= set(seen)


def test_a_taken_port_whose_holder_never_answers_ends_the_warmup_with_a_self_kill(
    start_fake_server, free_port
):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port))
        sock.listen()
        server = start_fake_server(port=free_port, scenario={"warmup_tries": 1})
        assert server.proc.wait(timeout=30) == -signal.SIGKILL  # kill_process_tree, parent too
    assert "Initialization failed. warmup error:" in server.log_text()
    assert (
        f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', "
        f"{free_port}): address already in use" in server.log_text()
    )


@pytest.mark.parametrize("kind", ["setsid", "double_fork"])
def test_orphan_escapes_the_process_group_and_holds_its_gpu(start_fake_server, gpu_state_dir, kind):
    server = start_fake_server(
        scenario={"orphan": {"kind": kind, "holds_gpu": True, "lifetime_s": 600}},
        state_dir=gpu_state_dir,
    )
    _up(server)

    def find_orphan() -> psutil.Process | None:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            marker = os.environ["FAKE_SGLANG_MARKER"]
            if (
                cmd
                and cmd[0] == f"sglang::tokenizer_worker:{proc.pid}"
                and proc.environ().get("FAKE_SGLANG_MARKER") == marker
            ):
                return proc
        return None

    orphan = wait_until(find_orphan, what="orphan process")
    assert orphan is not None
    server.extra_pids.append(orphan.pid)
    assert os.getpgid(orphan.pid) != server.proc.pid
    wait_until(
        lambda: orphan.pid in [h.pid for h in gpu_state.read_holdings(gpu_state_dir)],
        what="orphan registered on GPU 0",
    )
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)
    assert orphan.is_running()  # the group kill missed it
    assert 0 in [h.gpu_index for h in gpu_state.read_holdings(gpu_state_dir) if h.pid == orphan.pid]
    orphan.kill()
    psutil.wait_procs([orphan], timeout=10)


def test_orphans_end_on_their_own():
    """Bounded life: a forgotten orphan goes away by itself after lifetime_s."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.testing.orphan", "setsid", "-1", "0", "0.2", "x"]
    )
    assert proc.wait(timeout=20) == 0
