"""`sglang-supervisor run` with simulated GPUs: a leftover of an earlier run holding a GPU is
killed and its memory awaited before the launch; other users of the target GPUs stop the start
unless --kill-foreign-gpu-processes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.testing import gpu_state
from tests.e2e.run_support import supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def escapee_of_a_killed_supervisor(
    tmp_path: Path, port: int, marker: str, state_dir: Path, gpu_state_dir: Path
) -> Iterator[list[int]]:
    """A supervisor whose server has a double-forked escapee holding GPU 0 is SIGKILLed; yields
    [escapee pid] once it is the only process of the tree left."""
    scenario = {"orphan": {"kind": "double_fork", "holds_gpu": True, "lifetime_s": 600}}
    with supervisor(
        tmp_path,
        port,
        marker,
        scenario=scenario,
        state_dir=state_dir,
        gpu_state_dir=gpu_state_dir,
    ) as first:
        first.wait_event("ready")
        # The escapee is spawned by rank 0 and registers on GPU 0 beside it, maybe after ready.
        wait_until(
            lambda: len(gpu_state.live_holders(gpu_state_dir, 0)) >= 2,
            timeout_s=10,
            what="the escapee holding GPU 0 beside rank 0",
        )
        first.signal(signal.SIGKILL)
        first.wait_exit()
        orphan = wait_until(
            lambda: t if len(t := first.tree()) == 1 else None,
            timeout_s=10,
            what="only the escapee left",
        )
        assert orphan is not None
        yield orphan


def test_a_leftover_holding_a_gpu_is_killed_and_its_memory_awaited(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir
):
    state_dir = tmp_path / "shared-state"
    marker = simulated_process_guard
    with escapee_of_a_killed_supervisor(
        tmp_path, free_port, marker, state_dir, gpu_state_dir
    ) as orphan:
        assert orphan[0] in gpu_state.live_holders(gpu_state_dir, 0)
        with supervisor(
            tmp_path, free_port, marker, state_dir=state_dir, gpu_state_dir=gpu_state_dir
        ) as second:
            # In a cgroup the escapee is still in our server group and is killed with it at
            # start (it may be gone before the scan for leftovers); in /proc mode the scan
            # finds it by its marker. Either way its GPU is awaited before the launch.
            contained = second.wait_event("containment")["mode"] != "/proc"
            found = "cgroup_leftovers_killed" if contained else "leftovers_found"
            assert orphan[0] in second.wait_event(found)["pids"]
            second.wait_event("ready")
            events = [e["event"] for e in second.events()]
            assert events.index("gpu_release_done") < events.index("launching")
            assert orphan[0] not in gpu_state.live_holders(gpu_state_dir, 0)
            second.signal(signal.SIGTERM)
            assert second.wait_exit() == 0


@pytest.mark.parametrize("kill_foreign", [False, True])
def test_a_foreign_process_on_a_target_gpu_stops_the_start_unless_killing_is_allowed(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir, kill_foreign
):
    foreign = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.DEVNULL,
    )
    try:
        gpu_state.register_holder(gpu_state_dir, 1, 10 << 30, pid=foreign.pid)
        options = ("--kill-foreign-gpu-processes",) if kill_foreign else ()
        with supervisor(
            tmp_path,
            free_port,
            simulated_process_guard,
            gpu_state_dir=gpu_state_dir,
            options=options,
        ) as sup:
            if not kill_foreign:
                assert sup.wait_exit() == 1
                assert f"pid {foreign.pid}" in sup.log_text().strip().splitlines()[-1]
                assert not sup.events("launching")
                assert foreign.poll() is None
                return
            sup.wait_event("ready")
            assert foreign.wait(timeout=10) == -signal.SIGKILL
            sup.signal(signal.SIGTERM)
            assert sup.wait_exit() == 0
    finally:
        foreign.kill()
        foreign.wait(timeout=10)


def test_a_foreign_process_beside_a_leftover_is_named_at_once_not_waited_for(
    tmp_path, free_port, simulated_process_guard, gpu_state_dir
):
    """The leftover is killed, but the foreign holder stops the start (exit 1, PID named) before
    any wait: waiting for GPUs it keeps could only end as "GPUs not released" (exit 6)."""
    state_dir = tmp_path / "shared-state"
    marker = simulated_process_guard
    with escapee_of_a_killed_supervisor(
        tmp_path, free_port, marker, state_dir, gpu_state_dir
    ) as orphan:
        foreign = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            stdin=subprocess.DEVNULL,
        )
        try:
            gpu_state.register_holder(gpu_state_dir, 1, 10 << 30, pid=foreign.pid)
            with supervisor(
                tmp_path, free_port, marker, state_dir=state_dir, gpu_state_dir=gpu_state_dir
            ) as second:
                assert second.wait_exit() == 1
                # Killed with our cgroup at start, or by the leftover scan (see above).
                killed = [
                    pid
                    for name in ("cgroup_leftovers_killed", "leftovers_killed")
                    for event in second.events(name)
                    for pid in event["pids"]
                ]
                assert orphan[0] in killed
                assert f"pid {foreign.pid}" in second.log_text().strip().splitlines()[-1]
                assert not second.events("gpu_release_failed")
                assert not second.events("launching")
                assert foreign.poll() is None
        finally:
            foreign.kill()
            foreign.wait(timeout=10)
