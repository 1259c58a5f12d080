"""run.leftovers: an earlier run's processes are killed before the first launch; another live
supervisor's server on our GPUs is never taken for ours; foreign holders stop the start with
their PID named and without their secrets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.config import RunSettings, SupervisorConfig
from supervisor.core.readings import ProcessInfo
from supervisor.errors import PreflightFailed
from supervisor.run.launch import record_tree
from supervisor.run.leftovers import classify_processes, clean_leftovers
from supervisor.run.state import STATE_FILE, ProcessRef, RunState, StateStore
from tests.fakes import FakeClock, FakeProc, FakeProcesses, ScriptedGpus, gpu

SECRET_TITLE = "python3 -m sglang.launch_server --api-key sk-live-0123456789 --tp 8"


def _settings(tmp_path: Path, *, name: str = "default", kill_foreign: bool = False) -> RunSettings:
    config = SupervisorConfig()
    run = dataclasses.replace(config.run, name=name, kill_foreign_gpu_processes=kill_foreign)
    config = dataclasses.replace(config, run=run)
    return RunSettings(
        config=config, server_command=("server",), server_args=(), state_dir=tmp_path
    )


def test_sglang_process_of_another_live_supervisor_on_our_gpu_is_foreign() -> None:
    processes = FakeProcesses(
        [
            FakeProc(pid=500, title="sglang-supervisor run", start_ticks=4242),
            FakeProc(
                pid=501,
                title="sglang::scheduler_TP0",
                instance="other",
                launched_by="500:4242",
                launcher_alive=True,
            ),
            # An unmarked SGLang process (its supervisor unknown) on our GPU still counts as ours.
            FakeProc(pid=601, title="sglang::scheduler_TP1"),
        ]
    )
    ours, foreign = classify_processes(processes, RunState(instance="mine"), "mine", [501, 601])
    assert [p.pid for p in ours] == [601]
    assert [p.pid for p in foreign] == [501]


def test_recorded_pids_and_our_marker_are_leftovers_anywhere_a_reused_pid_is_not() -> None:
    processes = FakeProcesses(
        [
            FakeProc(pid=20, title="python -m sglang.launch_server", start_ticks=7),
            FakeProc(pid=21, title="python -m sglang.launch_server", start_ticks=999),
            FakeProc(pid=22, title="sglang::detokenizer", instance="mine"),
            FakeProc(pid=23, title="bash"),
        ]
    )
    state = RunState(
        server_pids=(
            ProcessRef(pid=20, start_ticks=7, title="server"),
            ProcessRef(pid=21, start_ticks=8, title="server"),  # PID reused by another process
        )
    )
    ours, foreign = classify_processes(processes, state, "mine", [])
    assert [p.pid for p in ours] == [20, 22]
    assert foreign == ()


def test_a_dead_process_of_an_earlier_run_is_no_leftover_to_find_or_kill() -> None:
    """A zombie (say, one the containment just killed in our cgroup, not yet reaped by init)
    is already gone: neither reported as found nor sent a SIGKILL, on a GPU or not."""
    processes = FakeProcesses(
        [
            FakeProc(pid=30, title="sglang::scheduler_TP0", state="Z", instance="mine"),
            FakeProc(pid=31, title="python -m sglang.launch_server", state="Z", start_ticks=7),
            FakeProc(pid=32, title="sglang::detokenizer", instance="mine"),
            FakeProc(pid=33, title="python", state="Z"),
        ]
    )
    state = RunState(server_pids=(ProcessRef(pid=31, start_ticks=7, title="server"),))
    ours, foreign = classify_processes(processes, state, "mine", [30, 33])
    assert [p.pid for p in ours] == [32]
    assert foreign == ()


def test_recorded_tree_titles_in_the_state_file_hold_no_api_key(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    main = ProcessInfo(pid=200, ppid=100, pgid=200, state="S", title=SECRET_TITLE, start_ticks=9)

    class Tree:
        def tree(self) -> tuple[ProcessInfo, ...]:
            return (main,)

    record_tree(store, Tree())  # type: ignore[arg-type]  # record_tree only reads the tree
    text = (tmp_path / STATE_FILE).read_text()
    assert "sk-live" not in text
    assert store.load().server_pids[0].pid == 200


def test_foreign_gpu_holder_named_in_the_refusal_without_its_api_key(tmp_path: Path) -> None:
    clock = FakeClock()
    processes = FakeProcesses([FakeProc(pid=4321, title="vllm --api-key sk-live-0123456789")])
    with pytest.raises(PreflightFailed) as exc:
        clean_leftovers(
            processes,
            RunState(),
            _settings(tmp_path),
            [0],
            sensor=ScriptedGpus(clock, lambda t: (gpu(0, 10, 4321),)),
            clock=clock,
            wait_released=lambda pids: None,
        )
    assert "pid 4321" in str(exc.value)
    assert "sk-live" not in str(exc.value)
    assert processes.killed == []


def test_foreign_holders_are_killed_only_when_allowed_and_then_the_gpus_are_waited_for(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    processes = FakeProcesses([FakeProc(pid=4321, title="python train.py")])
    waited: list[tuple[int, ...]] = []
    clean_leftovers(
        processes,
        RunState(),
        _settings(tmp_path, kill_foreign=True),
        [0],
        sensor=ScriptedGpus(clock, lambda t: (gpu(0, 10, 4321),)),
        clock=clock,
        wait_released=lambda pids: waited.append(tuple(pids)),
    )
    assert processes.killed == [4321]
    assert waited == [(4321,)]


def test_leftovers_found_log_holds_no_api_key(tmp_path: Path) -> None:
    clock = FakeClock()
    processes = FakeProcesses(
        [FakeProc(pid=77, title="py --api-key sk-live-0123456789", start_ticks=1000)]
    )
    state = RunState(server_pids=(ProcessRef(pid=77, start_ticks=1000, title="server"),))
    with capture_logs() as logs:
        clean_leftovers(
            processes,
            state,
            _settings(tmp_path),
            [0],
            sensor=None,
            clock=clock,
            wait_released=lambda pids: None,
        )
    found = [e for e in logs if e["event"] == "leftovers_found"]
    assert found
    assert found[0]["pids"] == [77]
    assert processes.killed == [77]
    assert "sk-live" not in repr(logs)


def test_a_leftover_that_survives_sigkill_is_reported_at_the_deadline(tmp_path: Path) -> None:
    clock = FakeClock()
    processes = FakeProcesses(
        [FakeProc(pid=78, title="sglang::scheduler", instance="mine", survives_kill=True)]
    )
    with capture_logs() as logs:
        clean_leftovers(
            processes,
            RunState(),
            _settings(tmp_path, name="mine"),
            [0],
            sensor=None,
            clock=clock,
            wait_released=lambda pids: None,
        )
    killed = [e for e in logs if e["event"] == "leftovers_killed"]
    assert killed[0]["still_present"] == [78]
    assert clock.now >= 1010.0  # LEFTOVER_EXIT_WAIT_S waited, on the fake clock


@pytest.mark.parametrize(("killed", "awaited"), [((4242, 4243), [(4242, 4243)]), ((), [])])
def test_what_the_containment_already_killed_is_awaited_on_the_gpus_too(
    tmp_path: Path, killed: tuple[int, ...], awaited: list[tuple[int, ...]]
) -> None:
    """The cgroup's leftovers were killed before the runner: nothing is left for the scan, but
    the GPUs may still hold their memory, so the release wait covers them (and with nothing
    killed or found, nothing is awaited)."""
    waited: list[tuple[int, ...]] = []
    clean_leftovers(
        FakeProcesses([]),
        RunState(),
        _settings(tmp_path),
        [0],
        sensor=None,
        clock=FakeClock(),
        wait_released=lambda pids: waited.append(tuple(pids)),
        killed=killed,
    )
    assert waited == awaited
