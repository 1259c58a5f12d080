"""Signals to the real `sglang-supervisor run`: which ones stop it, which ones it answers, a stop
that arrives while it is still starting up, and the supervisor as a container's PID 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.run_support import ROOT, Supervisor, marked_pids, supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def test_hup_usr1_usr2_and_pipe_leave_the_server_alone_and_sigquit_stops_it(
    tmp_path, free_port, simulated_process_guard
):
    with supervisor(tmp_path, free_port, simulated_process_guard) as sup:
        sup.wait_event("ready")
        before = sup.schedulers()
        sup.signal(signal.SIGHUP)  # a reload of the same file: nothing changes, nothing stops
        reloaded = sup.wait_event("reloaded")
        assert (reloaded["applied"], reloaded["detail"]) == ([], "nothing changed")
        sup.signal(signal.SIGUSR1)
        status = sup.wait_event("status")
        assert (status["state"], status["restart_count"]) == ("ready", 0)
        sup.signal(signal.SIGUSR2)  # no meaning; must not kill (the default action would)
        sup.signal(signal.SIGPIPE)
        sup.signal(signal.SIGUSR1)
        sup.wait_event("status", count=2)  # queued after USR2 and PIPE: those were handled
        assert sup.proc.poll() is None
        assert sup.schedulers() == before
        assert sup.events("unhealthy") == []

        sup.signal(signal.SIGQUIT)
        assert sup.wait_exit() == 0
        assert sup.events("stopping")[0]["reason"] == "SIGQUIT"
        assert sup.tree() == []


def _blocked_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    return 0


def test_a_sigterm_during_start_up_is_held_and_ends_the_run_before_any_launch(
    tmp_path, free_port, simulated_process_guard
):
    """systemd may stop a unit the moment it started it: the signal must not kill the
    supervisor half-initialised (Python's default would), nor be lost."""
    with supervisor(tmp_path, free_port, simulated_process_guard) as sup:
        term_bit = 1 << (signal.SIGTERM - 1)
        wait_until(
            lambda: _blocked_signals(sup.proc.pid) & term_bit or sup.proc.poll() is not None,
            timeout_s=30,
            interval_s=0.001,
            what="SIGTERM blocked by the starting supervisor",
        )
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.events("launching") == []
        assert sup.events("stopped")[0]["reason"] == "SIGTERM"
        assert sup.tree() == []


def _children_states(pid: int) -> dict[int, str]:
    """The state letter of every child of `pid` (read from the host's /proc)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            out[int(entry.name)] = fields[0]
    return out


def _cmdline_bytes(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _supervisor_pid(sup: Supervisor) -> int | None:
    """The supervisor's host PID under `unshare --fork` (the wrapper is sup.proc)."""
    for pid in marked_pids(sup.marker):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"supervisor" in cmdline and b"run" in cmdline and pid != sup.proc.pid:
            return pid
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root")
def test_as_pid_1_the_supervisor_reaps_orphans_that_are_not_its_tree(
    tmp_path, free_port, simulated_process_guard
):
    wrapper = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL")
    with supervisor(tmp_path, free_port, simulated_process_guard, wrapper=wrapper) as sup:
        sup.wait_event("ready")
        found = wait_until(lambda: _supervisor_pid(sup), timeout_s=10, what="the supervisor")
        assert found is not None
        me = found
        nspid = next(
            line
            for line in Path(f"/proc/{me}/status").read_text().splitlines()
            if line.startswith("NSpid:")
        )
        assert nspid.split()[-1] == "1", nspid
        # An orphan of an `exec` into the container: its parent exits at once, so it is
        # reparented to PID 1, outside the server's tree; it exits once `release` exists.
        release = tmp_path / "release-orphan"
        script = (
            "import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    for _ in range(3000):\n"
            "        if os.path.exists(sys.argv[1]):\n"
            "            break\n"
            "        time.sleep(0.01)\n"
        )
        subprocess.run(
            [
                "nsenter",
                "--target",
                str(me),
                "--pid",
                "--",
                sys.executable,
                "-c",
                script,
                str(release),
            ],
            check=True,
            cwd=ROOT,
        )

        def orphan() -> int | None:
            for pid in _children_states(me):
                if str(release).encode() in _cmdline_bytes(pid):
                    return pid
            return None

        pid = wait_until(orphan, timeout_s=10, what="the orphan reparented to the supervisor")
        assert pid is not None
        release.touch()
        wait_until(
            lambda: pid not in _children_states(me),
            timeout_s=20,
            what=f"the orphan {pid} reaped",
        )
        assert sup.events("unhealthy") == []
        os.kill(me, signal.SIGTERM)
        assert sup.wait_exit() == 0
        assert sup.tree() == []


def test_an_escapee_that_dies_while_the_server_runs_is_reaped_not_left_a_zombie(
    tmp_path, free_port, simulated_process_guard
):
    """A double fork reparents the escapee to the supervisor (the tree's subreaper): when it
    exits while the server keeps running, its zombie is the supervisor's to collect."""
    scenario = {"orphan": {"kind": "double_fork", "after_s": 0.0, "lifetime_s": 600}}
    with supervisor(tmp_path, free_port, simulated_process_guard, scenario=scenario) as sup:
        sup.wait_event("ready")
        me = sup.proc.pid

        def escapee() -> int | None:
            for pid in _children_states(me):
                if b"tokenizer_worker" in _cmdline_bytes(pid):
                    return pid
            return None

        pid = wait_until(escapee, timeout_s=20, what="the escapee reparented to the supervisor")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: pid not in _children_states(me), timeout_s=20, what="the zombie reaped")
        assert sup.events("unhealthy") == [], "an escapee's death is not the server's"
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
