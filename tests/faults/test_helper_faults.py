"""Faults of the operator's commands: a GPU reset that hangs, a hook that hangs, a hook running
when the supervisor is SIGKILLed. Each command starts a plain child and a `setsid` one (both
inherit the leak guard's marker, so the invariants see a survivor); after the command's
timeout, or at the next start, nothing of it is left, and the supervisor's cgroups can be
removed (the harness fails the test on a group left behind)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.testing.procs import alive
from tests.e2e.run_support import Supervisor, supervisor
from tests.faults.support import assert_invariants, faulted, recovered, refused, stop
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

# A plain child and a `setsid` one, their PIDs written to $0, then it hangs: shell and sleep
# start in milliseconds, far inside the timeouts below even on a loaded machine.
HUNG = 'sleep 300 & p=$!; setsid sleep 300 & echo "$p $!" > "$0"; echo started; exec sleep 300'


def children(*pid_files: Path) -> list[int]:
    return [int(word) for path in pid_files for word in path.read_text().split()]


def test_a_hung_reset_command_is_killed_with_its_setsid_child_and_the_run_ends_with_6(
    tmp_path: Path,
    free_port: int,
    simulated_process_guard: str,
    shm_record: Path,
    make_gpu_state: Callable[..., Path],
):
    gpus = make_gpu_state(2)
    reset = f"sh -c '{HUNG}' {tmp_path}/pids-{{index}}"
    gpu = {"reset_command": reset, "release_timeout": "1s", "reset_timeout": "2s"}
    with faulted(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"gpu_stuck": True},
        overrides={"gpu": gpu},
        gpus=gpus,
    ) as sup:
        sup.wait_event("ready")
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        refused(sup, 6, "timed out after 2 s")
        failed = sup.events("gpu_reset_failed")
        assert sorted(e["gpu"] for e in failed) == [0, 1]
        left = children(tmp_path / "pids-0", tmp_path / "pids-1")
        assert len(left) == 4
        assert not [pid for pid in left if alive(pid)]
    assert_invariants(tmp_path, sup, shm_record)


def test_a_hung_hook_is_killed_with_its_setsid_child_and_the_run_goes_on(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    pids = tmp_path / "pids"
    hooks = {"on_ready": ["sh", "-c", HUNG, str(pids)], "timeout": "2s"}
    with faulted(tmp_path, free_port, simulated_process_guard, overrides={"hooks": hooks}) as sup:
        failed = sup.wait_event("hook_failed")
        assert "timed out after 2 s (killed)" in failed["error"]
        assert sorted(failed["killed_pids"]) == sorted(children(pids))
        assert not [pid for pid in children(pids) if alive(pid)]
        assert sup.proc.poll() is None  # the run goes on: one launch, no restart
        assert len(sup.events("launching")) == 1
        stop(sup)
    assert_invariants(tmp_path, sup, shm_record)


def hook_left_by_a_killed_supervisor(sup: Supervisor, pids: Path) -> list[int]:
    """The hook runs and has started its children: SIGKILL the supervisor under it."""
    sup.wait_event("ready")
    wait_until(lambda: pids.exists() and len(children(pids)) == 2, timeout_s=30, what="children")
    sup.signal(signal.SIGKILL)
    sup.wait_exit()
    hook = children(pids)
    assert all(alive(pid) for pid in hook)  # orphans now: nobody else would kill them
    return hook


def test_a_hook_a_killed_supervisor_left_running_is_killed_at_the_next_start(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    pids = tmp_path / "pids"
    state_dir = tmp_path / "state"
    hooks = {"on_ready": ["sh", "-c", HUNG, str(pids)], "timeout": "300s"}
    marker = simulated_process_guard
    with supervisor(
        tmp_path, free_port, marker, state_dir=state_dir, overrides={"hooks": hooks}
    ) as first:
        hook = hook_left_by_a_killed_supervisor(first, pids)
        with faulted(tmp_path, free_port, marker, state_dir=state_dir) as second:
            second.wait_event("ready")
            assert not [pid for pid in hook if alive(pid)]
            killed = [
                pid
                for name in ("cgroup_leftovers_killed", "leftovers_found")
                for event in second.events(name)
                for pid in event["pids"]
            ]
            assert set(hook) <= set(killed)
            recovered(second, ready_count=1)
    assert_invariants(tmp_path, second, shm_record)


def test_a_hook_still_running_at_a_stop_is_ended_by_its_timeout_and_leaves_nothing(
    tmp_path: Path, free_port: int, simulated_process_guard: str, shm_record: Path
):
    """The stop waits for the hook (bounded by its timeout), as for an `on_fatal` hook."""
    pids = tmp_path / "pids"
    hooks = {"on_ready": ["sh", "-c", HUNG, str(pids)], "timeout": "5s"}
    with faulted(tmp_path, free_port, simulated_process_guard, overrides={"hooks": hooks}) as sup:
        sup.wait_event("ready")
        wait_until(lambda: pids.exists() and len(children(pids)) == 2, timeout_s=30, what="kids")
        stop(sup)
        assert sup.events("hook_failed")
        assert not [pid for pid in children(pids) if alive(pid)]
    assert_invariants(tmp_path, sup, shm_record)
