"""A server dead of a SIGKILL in the run loop: the kernel's OOM-kill counters (the host's, the
tree cgroup's) decide whether it is called an OOM kill, and SGLang's self-kill after a child's
failure is named in the `server_failed` event."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.core.events import SignalEvent
from tests.run.runner_support import LOAD_S, WARM_S, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


@pytest.mark.parametrize(
    ("host_grew", "tree_grew", "failure"),
    [
        (0, 0, "exited_unexpectedly"),  # a SIGKILL the kernel did not count
        (1, None, "kernel_oom_killed"),  # /proc/vmstat grew, no cgroup memory controller
        (1, 0, "exited_unexpectedly"),  # the host's OOM kill took a process of another cgroup
        (0, 1, "kernel_oom_killed"),  # the tree's cgroup counted one of its own
    ],
)
def test_a_sigkilled_server_is_called_oom_killed_only_on_the_kernels_count(
    tmp_path: Path, host_grew: int, tree_grew: int | None, failure: str
):
    w = world(tmp_path)
    w.processes.oom_kills = 10

    def start_then_killed(server) -> None:
        w.on_start(server)
        server.tree_oom_kills = None if tree_grew is None else 3

        def killed() -> None:
            w.processes.oom_kills = 10 + host_grew
            if tree_grew is not None:
                server.tree_oom_kills = 3 + tree_grew
            server.exit_by_itself(None, 9)

        w.events.call_at(w.clock.now + LOAD_S + WARM_S + 2.0, killed)

    w.launcher.on_start = start_then_killed
    w.events.at(LOAD_S + WARM_S + 30.0, SIGTERM)
    run = runner(w, settings(tmp_path), watch_gpus=False)
    with capture_logs() as logs:
        assert run.run() == 0
    failed = next(e for e in logs if e["event"] == "server_failed")
    assert (failed["failure"], failed["signal"]) == (failure, 9)
    assert (failed["oom_kills"], failed["tree_oom_kills"]) == (host_grew, tree_grew)
    assert failed["sglang_self_kill"] is False


def test_sglangs_own_sigkill_after_a_ranks_exception_is_named_in_the_event(tmp_path: Path):
    w = world(tmp_path)

    def start_then_self_kill(server) -> None:
        w.on_start(server)

        def self_kill() -> None:
            server.say("[TP1] Scheduler hit an exception: Traceback (most recent call last):")
            server.say("ValueError: boom")
            server.say("SIGQUIT received. signum=3, frame=None. It usually means one child failed.")
            server.say(
                f"kill_process_tree called: parent_pid={server.pid}, include_parent=True, "
                f"pid={server.pid}"
            )
            server.exit_by_itself(None, 9)

        w.events.call_at(w.clock.now + LOAD_S + WARM_S + 2.0, self_kill)

    w.launcher.on_start = start_then_self_kill
    w.events.at(LOAD_S + WARM_S + 30.0, SIGTERM)
    run = runner(w, settings(tmp_path), watch_gpus=False)
    with capture_logs() as logs:
        assert run.run() == 0
    failed = next(e for e in logs if e["event"] == "server_failed")
    assert (failed["failure"], failed["sglang_self_kill"]) == ("rank_crash", True)
    assert "killed its own tree after a child failed" in failed["hint"]
    assert "ValueError: boom" in failed["hint"]
