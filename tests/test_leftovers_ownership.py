"""A live supervisor's server on our GPUs is never taken for ours: not a leftover to kill at
start, not a holder to kill while waiting for the GPUs; it is reported as a foreign holder."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from supervisor.adapters.procfs import INSTANCE_ENV, SUPERVISOR_ENV, ProcReader
from supervisor.cleanup import is_ours_by_sight
from supervisor.core.readings import GpuProcess, GpuState
from supervisor.leftovers import find_leftovers, foreign_gpu_holders
from supervisor.state import RunState
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
