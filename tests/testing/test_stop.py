"""How the simulated server stops, as SGLang 0.5.23 does (supervisor/testing/stopping.py).

Each test waits on what the server shows (log lines, HTTP answers, process states), never on time.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tests.testing.support import FakeServer, post_generate
from tests.waiting import wait_until

SIGTERM_LINE = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
RUNNING_SIGQUIT = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
LAUNCH_SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def _up(server: FakeServer) -> None:
    wait_until(lambda: server.status() == 200, what="server up (/health 200)")


def _exit_status(server: FakeServer, timeout_s: float = 30.0) -> int:
    """The main process's exit status; on a timeout, the failure shows what the tree was doing."""
    try:
        return server.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tree = []
        for proc in psutil.Process(server.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                masks = [
                    line
                    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                    if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
                ]
                tree.append(f"{proc.pid} {proc.status()} {' '.join(proc.cmdline())[:40]} {masks}")
        own = [
            line
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith(("SigBlk", "SigIgn"))
        ]
        tree.append(f"pytest {own}")
        pytest.fail(f"server still running: {tree}; log tail: {server.log_text()[-3000:]}")


def _gone(procs: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


def _in_flight(server: FakeServer, pool: ThreadPoolExecutor) -> Future[int]:
    """A /generate that is in flight (counted by the server) when this returns."""
    request = pool.submit(post_generate, server.port)
    wait_until(lambda: server.running_requests() == 1, what="the request counted in flight")
    return request


def test_sigterm_drains_requests_in_flight_then_exits_0(start_fake_server):
    server = start_fake_server(
        ["--tp-size", "2", "--enable-metrics"],
        scenario={"request_s": 3.0, "drain_poll_s": 0.05},
    )
    _up(server)
    ranks = list(server.titled().values())
    with ThreadPoolExecutor(2) as pool:
        request = _in_flight(server, pool)
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: server.status() == 503, what="/health 503 while draining")
        assert server.status("/ready") == 503
        # A request arriving while draining is served too (generate_request does not refuse).
        assert post_generate(server.port) == 200
        assert request.result(timeout=30) == 200
    assert server.proc.wait(timeout=30) == 0
    log = server.log_text()
    assert SIGTERM_LINE in log
    assert "Health check request received during shutdown. Returning 503." in log
    drained = server.log_lines("Gracefully exiting... Remaining number of requests")
    assert re.search(
        r"\] Gracefully exiting\.\.\. Remaining number of requests [12]\. Remaining requests "
        r"remaining_rids=\['[0-9a-f]{32}'(, '[0-9a-f]{32}')?\]\.$",
        drained[0],
    )
    assert drained[-1].endswith(
        "Gracefully exiting... Remaining number of requests 0. "
        "Remaining requests remaining_rids=[]."
    )
    # The schedulers left on the ShutdownReq; the watchdog, stopped first, saw no crash.
    assert "Schedulers still alive" not in log
    assert "crashed with exit code" not in log
    assert log.index(drained[-1]) < log.index("include_parent=False") < log.index("Shutting down")
    wait_until(lambda: _gone(ranks), what="every rank gone")


def test_a_scheduler_that_does_not_exit_is_killed_after_the_timeout(start_fake_server):
    server = start_fake_server(
        ["--tp-size", "2"],
        scenario={"hang": {"rank": 1, "after_s": 0}, "scheduler_exit_timeout_s": 0.3},
    )
    wait_until(lambda: server.status("/ready") == 200, what="server up")
    stopped = server.titled()["sglang::scheduler_TP1"]
    wait_until(lambda: stopped.status() == psutil.STATUS_STOPPED, what="TP1 stopped")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert (
        f"Schedulers still alive 0.3s after ShutdownReq, killing them before they released: "
        f"[{stopped.pid}]" in server.log_text()
    )


def test_sigterm_after_a_failed_health_check_force_exits(start_fake_server):
    server = start_fake_server(scenario={"health_fail_after_s": 0, "crash_dump_wait_s": 0.1})
    wait_until(lambda: server.status("/ready") == 200, what="warmed up")
    assert server.status() == 503
    assert "Health check failed." in server.log_text()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    log = server.log_text()
    assert "Signal SIGTERM received while health check failed. Force exiting." in log
    assert "Gracefully exiting" not in log


def test_sgl_force_shutdown_skips_the_drain(start_fake_server, monkeypatch):
    monkeypatch.setenv("SGL_FORCE_SHUTDOWN", "1")
    server = start_fake_server(["--enable-metrics"], scenario={"request_s": 60})
    _up(server)
    with ThreadPoolExecutor(1) as pool:
        request = _in_flight(server, pool)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0  # the request in flight is not waited for
        request.cancel()
    log = server.log_text()
    assert "Signal SIGTERM received while force shutdown flag set. Force exiting." in log
    assert "Gracefully exiting" not in log


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, -15), (signal.SIGINT, 1)])
def test_a_child_has_no_handler_and_the_watchdog_reports_it(start_fake_server, sig, code):
    """SIGTERM kills a scheduler (-15); SIGINT raises KeyboardInterrupt in it (exit 1)."""
    server = start_fake_server(["--tp-size", "2"], scenario={"crash_dump_wait_s": 0.1})
    _up(server)
    rank = server.titled()["sglang::scheduler_TP1"]
    rank.send_signal(sig)
    assert _exit_status(server) == -signal.SIGKILL
    log = server.log_text()
    assert (
        f"Subprocess scheduler_1 (pid={rank.pid}) crashed with exit code {code}. "
        "Triggering SIGQUIT for cleanup..." in log
    )
    assert RUNNING_SIGQUIT in log
    assert log.index("Triggering SIGQUIT") < log.index(RUNNING_SIGQUIT)


def test_without_crash_dumps_the_running_phase_handler_kills_at_once(
    start_fake_server, monkeypatch
):
    """dump_requests_before_crash does nothing when both dump switches are off."""
    monkeypatch.setenv("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
    monkeypatch.setenv("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "false")
    server = start_fake_server(scenario={"crash_dump_wait_s": 60})
    _up(server)
    server.titled()["sglang::scheduler"].kill()
    assert server.proc.wait(timeout=30) == -signal.SIGKILL  # not after 60 s
    assert RUNNING_SIGQUIT in server.log_text()


def test_sigquit_before_the_first_request_takes_the_launch_phase_handler(start_fake_server):
    """Without warmup and without a request, the tokenizer manager's handlers are not there."""
    server = start_fake_server(["--skip-server-warmup"], scenario={"crash_dump_wait_s": 60})
    wait_until(lambda: "The server is fired up and ready to roll!" in server.log_text(), what="up")
    server.proc.send_signal(signal.SIGQUIT)
    assert server.proc.wait(timeout=30) == -signal.SIGKILL  # no crash-dump wait here
    assert LAUNCH_SIGQUIT in server.log_text()


def test_sigterm_before_the_first_request_stops_uvicorn_and_dies_by_it(start_fake_server):
    server = start_fake_server(["--tp-size", "2", "--skip-server-warmup"])
    wait_until(lambda: "The server is fired up and ready to roll!" in server.log_text(), what="up")
    ranks = list(server.titled().values())
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == -signal.SIGTERM
    log = server.log_text()
    assert SIGTERM_LINE not in log
    assert "INFO:     Shutting down" in log
    assert f"INFO:     Finished server process [{server.proc.pid}]" in log
    assert "kill_process_tree called" not in log  # the signal ended it before any finally
    wait_until(lambda: _gone(ranks), what="ranks gone by PDEATHSIG")


def test_sigterm_during_the_warmup_fails_the_warmup_which_kills_the_tree(start_fake_server):
    server = start_fake_server(scenario={"warmup_s": 60})
    wait_until(lambda: server.status() == 503, what="HTTP up, warming")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    log = server.log_text()
    assert log.index("INFO:     Shutting down") < log.index("Initialization failed. warmup error: ")
    assert "include_parent=True" in log
    assert "Finished server process" not in log


def test_sigint_stops_uvicorn_then_kills_the_children_and_exits_by_sigint(start_fake_server):
    server = start_fake_server(["--tp-size", "2"])
    _up(server)
    ranks = list(server.titled().values())
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=30) == -signal.SIGINT
    log = server.log_text()
    assert "INFO:     Shutting down" in log
    assert "KeyboardInterrupt" in log
    assert "kill_process_tree called: " in log
    wait_until(lambda: _gone(ranks), what="ranks killed")


def test_sigterm_while_loading_kills_the_main_process_at_once(start_fake_server):
    server = start_fake_server(["--tp-size", "2"], scenario={"startup_s": 30})
    wait_until(lambda: len(server.log_lines("Load weight begin.")) == 2, what="both ranks loading")
    ranks = list(server.titled().values())
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == -signal.SIGTERM
    wait_until(lambda: _gone(ranks), what="ranks gone by PDEATHSIG")


def test_a_worker_node_logs_sigterm_and_keeps_serving(start_fake_server):
    server = start_fake_server(
        ["--tp-size", "2", "--nnodes", "2", "--node-rank", "1"],
        scenario={"health_fail_after_s": 0},
    )
    wait_until(lambda: server.status() == 200, what="dummy health server up")
    assert set(server.titled()) == {"sglang::scheduler_TP1"}  # no detokenizer on worker nodes
    assert server.status("/ready") == 404  # the dummy server has /health, /health_generate, /ping
    assert server.status("/ping") == 200
    server.proc.send_signal(signal.SIGTERM)
    line = (
        "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast to stop "
        "the schedulers."
    )
    wait_until(lambda: line in server.log_text(), what="the worker node's SIGTERM line")
    assert server.status() == 200
    assert server.proc.poll() is None
    server.proc.send_signal(signal.SIGKILL)
    assert server.proc.wait(timeout=30) == -signal.SIGKILL


def test_a_worker_node_exits_0_once_its_schedulers_are_gone(start_fake_server):
    server = start_fake_server(["--tp-size", "2", "--nnodes", "2", "--node-rank", "1"])
    wait_until(lambda: server.status() == 200, what="dummy health server up")
    rank = server.titled()["sglang::scheduler_TP1"]
    rank.send_signal(signal.SIGTERM)  # no watchdog on a worker node: only the join notices
    assert server.proc.wait(timeout=30) == 0
    assert f"Scheduler or DataParallelController {rank.pid} terminated with -15" in (
        server.log_text()
    )
