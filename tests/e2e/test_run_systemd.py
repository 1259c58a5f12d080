"""`sglang-supervisor run` as systemd runs it: a notify socket nobody reads never stalls the run
(READY=1 and STOPPING=1 wait, pending, and what systemd never got is logged at exit), waits
before the first READY=1 extend the start timeout, `--model-config` lets the shipped kind of
config start on a box where the model is not downloaded yet, and WATCHDOG=1 goes on while GPUs
are reset (in parallel, off the loop)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.run_support import MODEL_CONFIG, Supervisor, supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _fill(sup: Supervisor) -> int:
    """Fill the notify socket's queue (net.unix.max_dgram_qlen): from now on nothing the
    supervisor sends gets in until the test reads."""
    assert sup.notify is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
        filler.connect(sup.notify.getsockname())
        for count in range(100_000):
            try:
                filler.send(b"FILLER=1", socket.MSG_DONTWAIT)
            except BlockingIOError:
                return count
    raise AssertionError("the notify socket's queue never filled")


def test_a_notify_socket_nobody_reads_stalls_nothing_and_ready_stays_pending(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        notify=True,
        env={"WATCHDOG_USEC": "1000000"},  # WATCHDOG=1 every 0.5 s: each one dropped too
    ) as sup:
        _fill(sup)
        sup.wait_event("ready")
        first = sup.wait_event("sd_notify_dropped")  # the first drop is told at once
        assert first["dropped"] >= 1
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.tree() == []
        last = sup.events("sd_notify_dropped")[-1]
        assert last["pending"] == ["READY=1", "STOPPING=1"]  # systemd never read them
        assert last["dropped"] > first["dropped"]
        assert sup.events()[-1]["event"] == "sd_notify_dropped"  # after `stopped`, at exit
        assert not any(d.startswith("READY=1") for d in sup.received())


def test_a_backoff_before_the_first_ready_extends_the_start_timeout(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        notify=True,
        scenario={"exit_code_on_start": 1},  # dies while loading: never ready
        options=("--backoff-initial", "60s", "--backoff-max", "60s"),
    ) as sup:
        sup.wait_event("restarting")

        def long_extensions() -> list[float]:
            values = [
                int(d.split("=", 1)[1]) / 1e6
                for d in sup.received()
                if d.startswith("EXTEND_TIMEOUT_USEC=")
            ]
            # The load's own extensions reach at most the stall timeout (30 s) + 30 s; the
            # backoff's cover its 60 s plus a GPU reset's and an NVML query's timeouts + 30 s.
            return [v for v in values if v > 60 + 30]

        extensions = wait_until(long_extensions, timeout_s=10, what="a backoff extension")
        assert extensions is not None
        assert all(v <= 60 + 120 + 5 + 30 for v in extensions)
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


def test_model_config_on_the_command_line_starts_a_model_that_is_not_here(
    tmp_path, free_port, simulated_process_guard
):
    without = {"server": {"model_config": None}}
    with supervisor(tmp_path, free_port, simulated_process_guard, overrides=without) as sup:
        assert sup.wait_exit() == 2
        final = sup.events()[-1]
        assert final["event"] == "fatal"
        assert "--model-config PATH or [server] model_config" in final["reason"]
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        overrides=without,
        options=("--model-config", str(MODEL_CONFIG), "--weights", "1GB"),
    ) as sup:
        sup.wait_event("ready")
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0


# A reset command that says it started over a Unix socket the test holds, then blocks until the
# test answers: neither reset can end before the test lets it, whatever the machine's load.
BLOCKING_RESET = """\
import os, socket, sys
with socket.socket(socket.AF_UNIX) as conn:
    conn.connect(sys.argv[1])
    conn.sendall(f"start {sys.argv[2]}".encode())
    conn.recv(16)
os.execv(sys.executable, [sys.executable, "-m", "supervisor.testing.fake_gpu_reset", sys.argv[2]])
"""


@contextlib.contextmanager
def reading_notify(sup: Supervisor) -> Iterator[Callable[[], list[str]]]:
    """Read the notify socket on a thread of its own while the test blocks elsewhere: a full
    queue would make the supervisor drop WATCHDOG=1 and STATUS= (net.unix.max_dgram_qlen).
    Yields a function returning what arrived so far."""
    notify = sup.notify
    assert notify is not None
    done = threading.Event()
    lock = threading.Lock()

    def read() -> None:
        while not done.is_set():
            select.select([notify], [], [], 0.1)  # the timeout only checks `done`
            with lock:
                sup.received()

    def arrived() -> list[str]:
        with lock:
            return list(sup.received())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield arrived
    finally:
        done.set()
        reader.join()


def test_resets_run_in_parallel_while_watchdog_keepalives_go_on(
    tmp_path, free_port, simulated_process_guard, make_gpu_state
):
    """WatchdogSec=0.4 s: a keep-alive is due every 0.1 s. Both resets must have started before
    either may end, and a WATCHDOG=1 must arrive while they block; order, not time, is asserted."""
    script = tmp_path / "reset.py"
    script.write_text(BLOCKING_RESET)
    address = str(tmp_path / "resets.sock")
    reset = f"{sys.executable} {script} {address} {{index}}"
    gpu = {"reset_command": reset, "release_timeout": "1s"}
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        listener.listen(8)
        listener.settimeout(60)
        with (
            supervisor(
                tmp_path,
                free_port,
                simulated_process_guard,
                notify=True,
                scenario={"gpu_stuck": True},
                gpu_state_dir=make_gpu_state(2),
                env={"WATCHDOG_USEC": "400000"},
                overrides={"gpu": gpu},
            ) as sup,
            reading_notify(sup) as arrived,
        ):
            sup.wait_event("ready")
            os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
            resets = [listener.accept()[0] for _ in range(2)]  # both started, both blocked
            try:
                assert sorted(conn.recv(16) for conn in resets) == [b"start 0", b"start 1"]
                seen = len(arrived())
                wait_until(
                    lambda: "WATCHDOG=1" in arrived()[seen:],
                    timeout_s=30,
                    what="WATCHDOG=1 while both resets block",
                )
                statuses = [d for d in arrived() if d.startswith("STATUS=resetting")]
                assert statuses[0].startswith("STATUS=resetting GPU(s) 0, 1: 0 of 2 done")
            finally:
                for conn in resets:
                    conn.sendall(b"go")
                    conn.close()
            sup.wait_event("ready", count=2)
            assert len(sup.events("gpu_reset_done")) == 2
            assert any("0, 1: 2 of 2 done" in d for d in arrived() if d.startswith("STATUS="))
            sup.signal(signal.SIGTERM)
            assert sup.wait_exit() == 0
