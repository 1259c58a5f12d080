"""A live supervisor's server on our GPUs is never taken for ours: not a leftover to kill at
start, not a holder to kill while waiting for the GPUs; it is reported as a foreign holder."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.procfs import INSTANCE_ENV, SUPERVISOR_ENV, ProcReader
from supervisor.cleanup import is_ours_by_sight
from supervisor.config import SupervisorConfig
from supervisor.core.readings import GpuProcess, GpuState, ProcessInfo
from supervisor.errors import PreflightFailed
from supervisor.launch import RunSettings, record_tree
from supervisor.leftovers import clean_leftovers, find_leftovers, foreign_gpu_holders
from supervisor.state import STATE_FILE, ProcessRef, RunState, StateStore
from tests.adapters.test_procfs import write_proc


def _gpu(index: int, *pids: int) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        name="H200",
        total_bytes=100,
        used_bytes=10,
        processes=tuple(GpuProcess(pid=p, used_bytes=None) for p in pids),
    )


def test_sglang_process_of_another_live_supervisor_on_our_gpu_is_foreign(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    write_proc(root, 1, ppid=0, pgid=1, cmdline="/sbin/init")
    write_proc(root, 500, ppid=1, pgid=500, cmdline="sglang-supervisor run", start_ticks=4242)
    other = {INSTANCE_ENV: "other", SUPERVISOR_ENV: "500:4242"}
    write_proc(root, 501, ppid=500, pgid=501, cmdline="sglang::scheduler_TP0", environ=other)
    # An unmarked SGLang process (its supervisor unknown) on our GPU still counts as ours.
    write_proc(root, 601, ppid=1, pgid=601, cmdline="sglang::scheduler_TP1")
    proc = ProcReader(root)
    gpus = (_gpu(0, 501, 601),)

    found = find_leftovers(proc, RunState(instance="mine"), "mine", gpus, [0])

    assert [p.pid for p in found] == [601]
    foreign = foreign_gpu_holders(proc, gpus, [0], ours=(p.pid for p in found))
    assert [p.pid for p in foreign] == [501]


def test_a_process_launched_by_another_live_supervisor_is_not_ours_by_sight() -> None:
    parent = os.getppid()  # alive for the whole test, and not this process
    mark = f"{parent}:{ProcReader().start_ticks(parent)}"
    code = "import time; time.sleep(30)"
    other = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, INSTANCE_ENV: f"test-{uuid.uuid4().hex}", SUPERVISOR_ENV: mark},
    )
    try:
        assert not is_ours_by_sight(other.pid)
    finally:
        other.kill()
        other.wait()


# Above Linux's largest pid_max (2**22): a SIGKILL sent to it can reach no real process.
NO_PID = 2**22 + 12345
SECRET_TITLE = "python3 -m sglang.launch_server --api-key sk-live-0123456789 --tp 8"


class _FakeServer:
    """What record_tree reads of a ServerProcess: the tree and each PID's start time."""

    def __init__(self, tree: tuple[ProcessInfo, ...]) -> None:
        self._tree = tree
        self.proc = self

    def tree(self) -> tuple[ProcessInfo, ...]:
        return self._tree

    def start_ticks(self, pid: int) -> int:
        return 1000 + pid


def test_recorded_tree_titles_in_the_state_file_hold_no_api_key(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    main = ProcessInfo(pid=200, ppid=100, pgid=200, state="S", title=SECRET_TITLE)
    record_tree(store, _FakeServer((main,)))  # type: ignore[arg-type]
    text = (tmp_path / STATE_FILE).read_text()
    assert "sk-live" not in text
    assert store.load().server_pids[0].pid == 200


def test_foreign_gpu_holder_named_in_the_refusal_without_its_api_key(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    write_proc(root, 1, ppid=0, pgid=1, cmdline="/sbin/init")
    write_proc(root, NO_PID, ppid=1, pgid=NO_PID, cmdline="vllm --api-key sk-live-0123456789")
    settings = RunSettings(
        config=SupervisorConfig(),
        server_command=("server",),
        server_args=(),
        state_dir=tmp_path,
    )
    with pytest.raises(PreflightFailed) as exc:
        clean_leftovers(
            ProcReader(root),
            RunState(),
            settings,
            [0],
            sensor=_Gpus((_gpu(0, NO_PID),)),
            clock=_InstantClock(),
            wait_released=lambda pids: None,
        )
    assert f"pid {NO_PID}" in str(exc.value)
    assert "sk-live" not in str(exc.value)


def test_leftovers_found_log_holds_no_api_key(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    write_proc(root, 1, ppid=0, pgid=1, cmdline="/sbin/init")
    # Recorded by the earlier run, and long gone by the kill: the title is only logged.
    write_proc(root, NO_PID, ppid=1, pgid=NO_PID, cmdline="py --api-key sk-live-0123456789")
    state = RunState(server_pids=(ProcessRef(pid=NO_PID, start_ticks=1000, title="server"),))
    settings = RunSettings(
        config=SupervisorConfig(),
        server_command=("server",),
        server_args=(),
        state_dir=tmp_path,
    )
    with capture_logs() as logs:
        clean_leftovers(
            ProcReader(root),
            state,
            settings,
            [0],
            sensor=None,
            clock=_InstantClock(),
            wait_released=lambda pids: None,
        )
    found = [e for e in logs if e["event"] == "leftovers_found"]
    assert found
    assert found[0]["pids"] == [NO_PID]
    assert "sk-live" not in repr(logs)


class _Gpus:
    def __init__(self, gpus: tuple[GpuState, ...]) -> None:
        self._gpus = gpus

    def read_gpus(self) -> tuple[GpuState, ...]:
        return self._gpus

    def close(self) -> None:
        pass


class _InstantClock:
    """Deadlines pass at once: kill_processes gives up on a fake /proc entry immediately."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds + 100.0
