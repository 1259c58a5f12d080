"""The shared tree reader (kept-open /proc files) and the exit watcher (pidfds), for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from supervisor.adapters.tree import ExitWatcher, TreeReader
from tests.waiting import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_members_are_reread_through_their_open_files_until_they_are_gone():
    proc = subprocess.Popen(SLEEPER)
    reader = TreeReader()
    try:
        (first,) = reader.read([proc.pid], titles=True)
        assert first.pid == proc.pid
        assert "time.sleep(60)" in first.title
        assert proc.pid in reader.known()
        assert proc.pid in reader.pidfds()
        proc.kill()
        proc.wait()
        assert reader.read([proc.pid]) == ()  # reaped: the open files name nothing now
        assert proc.pid not in reader.known()
    finally:
        reader.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_zombie_is_read_with_how_it_ended():
    proc = subprocess.Popen(SLEEPER)
    reader = TreeReader()
    try:
        reader.read([proc.pid])
        proc.kill()  # not waited for: a zombie until reaped
        zombie = wait_until(
            lambda: z if (z := reader.read([proc.pid])) and z[0].is_zombie else None,
            timeout_s=10,
            what="the zombie",
        )
        assert zombie is not None
        raw = Path(f"/proc/{proc.pid}/stat").read_text()
        if len(raw[raw.rfind(")") + 2 :].split()) >= 50:
            assert zombie[0].exit_status == 9  # field 52, the wait status: killed by SIGKILL
        else:
            # Kernels (and sandboxes) whose stat stops before field 52 do not tell how it
            # ended: read as unknown, which the liveness judge treats as a zombie, not a death.
            assert zombie[0].exit_status is None
    finally:
        reader.close()
        proc.wait()


# A scheduler that forks: its child keeps the parent's title until the test lets it take its own.
FORKER = """
import os, sys, time
os.environ["SPT_NOENV"] = "1"
import setproctitle
setproctitle.setproctitle("sglang::scheduler_TP0")
go = sys.argv[1]
child = os.fork()
if child == 0:
    while not os.path.exists(go):
        time.sleep(0.01)
    setproctitle.setproctitle("lscpu -p=CPU,Core,Socket,Node")
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_a_forked_childs_title_is_read_again_until_it_is_its_own(tmp_path):
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKER, str(go)], stdout=subprocess.PIPE, text=True
    )
    reader = TreeReader()
    child = 0
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        parent_info, child_info = reader.read([proc.pid, child], titles=True)
        # setproctitle pads the argv area: the padding is stripped.
        assert parent_info.title == "sglang::scheduler_TP0"
        assert child_info.title == "sglang::scheduler_TP0"  # the parent's, inherited
        go.touch()
        retitled = wait_until(
            lambda: (r := reader.read([child], titles=True)) and r[0].title.startswith("lscpu"),
            timeout_s=10,
            what="the child's own title",
        )
        assert retitled
    finally:
        reader.close()
        if child:
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_exit_watcher_calls_back_when_a_watched_process_exits():
    proc = subprocess.Popen(SLEEPER)
    reader = TreeReader()
    exited: list[int] = []
    seen = threading.Event()

    def on_exit(pid: int) -> None:
        exited.append(pid)
        seen.set()

    watcher = ExitWatcher(on_exit)
    try:
        reader.on_new_member = watcher.watch
        reader.read([proc.pid])
        proc.kill()
        assert seen.wait(10.0)
        assert exited == [proc.pid]
    finally:
        watcher.close()
        reader.close()
        proc.wait()
