"""The server process adapter with real processes: own session, raised oom_score_adj, output
pump (tail, redaction, never blocking), and kill_all reaching escapees of the group."""

from __future__ import annotations

import os
import signal
import sys
import threading
import uuid
from pathlib import Path

import pytest

from supervisor.adapters.cgroup import CgroupError, InstanceCgroups, ServerCgroup, discover
from supervisor.adapters.output_pump import OutputPump
from supervisor.adapters.procfs import RUN_ENV
from supervisor.adapters.server_process import ServerProcess
from supervisor.core.classify import FailureKind
from supervisor.core.events import STOP_REQUESTED, KillReason
from tests.waiting import wait_until

SERVER = r"""
import os, subprocess, sys, time
print("starting with key sk-test-secret-1", flush=True)
sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
subprocess.Popen(sleeper)                           # same process group
subprocess.Popen(sleeper, start_new_session=True)   # escapes the group (setsid)
print("children started", flush=True)
time.sleep(30)
"""


def test_kill_all_takes_the_group_and_the_setsid_escapee(tmp_path: Path):
    lines: list[str] = []
    env = {**os.environ, RUN_ENV: "run-test"}
    server = ServerProcess.start(
        [sys.executable, "-c", SERVER],
        env,
        run_id="run-test",
        sink=lines.append,
        redact=lambda line: line.replace("sk-test-secret-1", "***"),
        oom_score_adj=500,
    )
    try:
        assert os.getpgid(server.pid) == server.pid  # its own session and group
        wait_until(lambda: server.output_lines >= 2, timeout_s=20, what="server output")
        tree = wait_until(
            lambda: t if len(t := server.tree()) == 3 else None,
            timeout_s=20,
            what="3 processes in the tree",
        )
        assert tree is not None
        pgids = {p.pgid for p in tree}
        assert len(pgids) == 2  # one escaped the group
        for p in tree:
            assert Path(f"/proc/{p.pid}/oom_score_adj").read_text().strip() == "500"
        assert server.tail()[0] == "starting with key ***"
        wait_until(lambda: len(lines) >= 2, timeout_s=5, what="lines forwarded to the sink")
        assert "sk-test-secret-1" not in "".join(lines)

        escapee = next(p.pid for p in tree if p.pgid != server.pgid)
        signalled = server.kill_all(KillReason(FailureKind.RANK_CRASH, "test"))
        assert escapee in signalled
        # process_mrelease follows each SIGKILL; a small process may be gone before it runs
        # (counted only when it freed memory: scripts/bench_watchdog.py reports how often).
        assert 0 <= server.memory_released <= len(signalled)
        wait_until(lambda: not server.remaining(), timeout_s=10, what="tree gone")
        status = wait_until(server.poll, timeout_s=5, what="exit status")
        assert status is not None
        assert status.signal_number == 9
        assert server.kill_reason is not None
        assert server.kill_reason.failure is FailureKind.RANK_CRASH
        # The first reason wins: a later stop does not overwrite why it was killed.
        server.terminate(STOP_REQUESTED)
        assert server.kill_reason.failure is FailureKind.RANK_CRASH
    finally:
        server.kill_all(STOP_REQUESTED)
        server.pump.join(5)
        server.close()


def test_the_pump_keeps_the_tail_and_drops_instead_of_blocking():
    read_fd, write_fd = os.pipe()
    release = threading.Event()

    def slow_sink(_line: str) -> None:
        release.wait(10)  # a stuck journald

    pump = OutputPump(
        os.fdopen(read_fd, "rb"), slow_sink, redact=str.upper, tail_lines=3, queue_lines=2
    )
    pump.start()
    with os.fdopen(write_fd, "wb") as writer:
        for i in range(50):
            writer.write(f"line {i}\n".encode())
    # The writer was never blocked: all 50 lines were read although the sink took none.
    wait_until(lambda: pump.lines == 50, timeout_s=10, what="all lines read")
    assert pump.tail() == ("LINE 47", "LINE 48", "LINE 49")
    assert pump.dropped >= 50 - 2 - 1
    release.set()
    pump.join(5)


def test_in_a_cgroup_membership_is_the_group_and_one_kill_takes_everything(tmp_path: Path):
    """The setsid escapee is a member from the start (no scan); cgroup.kill takes it too, and
    the killed processes' memory is handed back at once (process_mrelease)."""
    if os.geteuid() != 0:
        pytest.skip("cgroups are made by root here")
    try:
        groups = InstanceCgroups(discover(), f"test-{uuid.uuid4().hex[:8]}")
    except CgroupError as exc:
        pytest.skip(f"no cgroup v2 here: {exc}")
    cgroup = groups.create(move_self=False)
    server = ServerProcess.start(
        [sys.executable, "-c", SERVER],
        dict(os.environ),
        run_id="run-cg",
        sink=lambda _line: None,
        redact=lambda line: line,
        cgroup=cgroup,
    )
    exits = threading.Event()
    try:
        assert server.mode == cgroup.mode
        server.watch_exits(exits.set)
        # One escapes the process group (its setsid comes a moment after it is a process), not
        # the cgroup.
        tree = wait_until(
            lambda: t if len(t := server.tree()) == 3 and len({p.pgid for p in t}) == 2 else None,
            timeout_s=20,
            what="3 processes in the group, one in a session of its own",
        )
        assert tree is not None
        signalled = server.kill_all(KillReason(FailureKind.MEMORY_KILL, "test"))
        assert set(signalled) >= {p.pid for p in tree}
        assert cgroup.wait_empty(10.0)
        assert exits.wait(10.0)  # the exit watcher saw it
        assert 0 <= server.memory_released <= len(signalled)
        wait_until(server.poll, timeout_s=5, what="exit status")
    finally:
        server.close()
        assert groups.remove() == []


def test_a_cgroup_removed_under_us_falls_back_to_signals(tmp_path: Path):
    """The group's files vanish (removed behind our back): the kill still lands, by pidfd."""
    group_dir = tmp_path / "server"
    group_dir.mkdir()
    (group_dir / "cgroup.procs").write_text("")
    fake = ServerCgroup(group_dir, None, v2_memory=False)
    server = ServerProcess.start(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        dict(os.environ),
        run_id="run-gone",
        sink=lambda _line: None,
        redact=lambda line: line,
        cgroup=fake,
    )
    try:
        assert server.mode == "/proc"  # the pid never showed up in the fake group's procs
        (group_dir / "cgroup.procs").write_text(f"{server.pid}\n")
        server.cgroup = fake  # as if it had: now remove the group under it
        (group_dir / "cgroup.procs").unlink()
        group_dir.rmdir()
        server.kill_all(KillReason(FailureKind.RANK_CRASH, "test"))
        status = wait_until(server.poll, timeout_s=10, what="the process killed anyway")
        assert status is not None
        assert status.signal_number == 9
    finally:
        server.close()


def test_the_pump_s_queue_is_bounded_in_characters_too():
    """Long lines fill the queue by their size, not their count: a stuck sink holds at most
    queue_chars of them."""
    read_fd, write_fd = os.pipe()
    release = threading.Event()
    taken: list[str] = []

    def slow_sink(line: str) -> None:
        release.wait(10)
        taken.append(line)

    pump = OutputPump(os.fdopen(read_fd, "rb"), slow_sink, redact=str, queue_chars=3000)
    pump.start()
    with os.fdopen(write_fd, "wb") as writer:
        for i in range(20):
            writer.write(f"{i:04d}".encode() + b"x" * 996 + b"\n")  # 1,000 characters each
    wait_until(lambda: pump.lines == 20, timeout_s=10, what="all lines read")
    release.set()
    pump.join(5)
    # The first one the sink took at once, then three queued: the other sixteen dropped.
    assert 16 <= pump.dropped <= 17
    assert len(taken) == 20 - pump.dropped


SIGNAL_MASKS = r"""
for line in open("/proc/self/status"):
    if line.startswith(("SigBlk", "SigIgn")):
        print(line.strip(), flush=True)
"""


def test_the_server_starts_with_every_signal_at_its_default(tmp_path: Path):
    """What the supervisor ignores or blocks (a background shell's SIGINT, its own SIGUSR2, a
    held SIGTERM) is not handed on: SGLang's ranks would never see those signals."""
    lines: list[str] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR2)}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        server = ServerProcess.start(
            [sys.executable, "-c", SIGNAL_MASKS],
            {**os.environ},
            run_id="run-test",
            sink=lines.append,
            redact=lambda line: line,
            oom_score_adj=None,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for signum, handler in before.items():
            signal.signal(signum, handler)
    try:
        assert wait_until(server.poll, timeout_s=20, what="exit") is not None
        server.pump.join(5)
        masks = dict(line.split(":\t") for line in server.tail())
        assert masks["SigBlk"] == "0000000000000000"
        ignored = int(masks["SigIgn"], 16)
        for signum in (signal.SIGINT, signal.SIGUSR2, signal.SIGQUIT):  # Python ignores PIPE
            assert not ignored & (1 << (signum - 1)), signal.Signals(signum).name
    finally:
        server.kill_all(STOP_REQUESTED)
        server.close()
