"""The run loop of one group node, in-process on the fake clock (tests/run/runner_support.py):
the group's decision before the first launch (its --hicache-size is what gets launched), a death
that ends the run with exit 8 once the GPUs are free and never relaunches, the terminal kinds and
the crash loop that keep their codes, refusals on either side, the bounded waits, and a SIGHUP
that would relaunch the server in place."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.adapters import group_http
from supervisor.adapters.http_server import Request
from supervisor.config import GroupConfig, RunSettings
from supervisor.core.classify import FailureKind
from supervisor.core.events import SignalAction, SignalEvent
from supervisor.core.group_report import DecisionState
from supervisor.errors import (
    ConfigError,
    CrashLoop,
    GroupMustRecreate,
    PreflightFailed,
    ServerArgsRejected,
)
from supervisor.group.board import GroupBoard
from supervisor.group.client import LeaderLink
from supervisor.group.handshake import GroupHandshake
from supervisor.group.peer import LeaderWatch
from supervisor.run.group_mode import leader_watch
from supervisor.run.plugins import Plugins
from supervisor.run.runner import Runner
from tests.group.support import TOKEN, leader_on, listening, report, spec, wire
from tests.run.runner_support import LOAD_S, WARM_S, World, names, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")
SIGHUP = SignalEvent(signal.SIGHUP, "SIGHUP", SignalAction.RELOAD)
READY_AT = LOAD_S + WARM_S


def group_args(rank: int, size_gb: int = 40) -> tuple[str, ...]:
    """TP 4 over two nodes: two local ranks, each with a `size_gb` host pool."""
    return (
        *("--model-path", "m", "--tp", "4", "--enable-hierarchical-cache"),
        *("--hicache-size", str(size_gb), "--nnodes", "2", "--node-rank", str(rank)),
        *("--dist-init-addr", "127.0.0.1:20000"),
    )


def node_settings(
    tmp_path: Path, rank: int, size_gb: int = 40, group: GroupConfig | None = None, **run: Any
) -> RunSettings:
    base = settings(tmp_path, group_args(rank, size_gb), **run)
    config = dataclasses.replace(base.config, group=group or GroupConfig())
    return dataclasses.replace(base, config=config, group=spec(2, rank))


def node(
    w: World,
    start: RunSettings,
    *,
    board: GroupBoard | None = None,
    link: LeaderLink | None = None,
    timeout_s: float = 60.0,
    watch_gpus: bool = True,
) -> Runner:
    assert start.group is not None
    run = runner(w, start, watch_gpus=watch_gpus)
    handshake = GroupHandshake(
        spec=start.group,
        report_timeout_s=timeout_s,
        host=f"node-{start.group.node_rank}",
        board=board,
        link=link,
    )
    run.io = dataclasses.replace(run.io, group=handshake)
    return run


def worker_reported(board: GroupBoard, size_gb: int = 40) -> GroupBoard:
    """Node 1's report on the leader's board, as its POST delivers it."""
    body = json.dumps(wire(report(1, size_gb=size_gb))).encode()
    request = Request(
        "POST", "/group/report", headers={"authorization": f"Bearer {TOKEN}"}, body=body
    )
    assert board.handle_report(request).status == 200
    return board


def test_a_death_files_it_releases_the_gpus_and_ends_with_exit_8_without_a_relaunch(tmp_path):
    w = world(tmp_path)
    run = node(w, node_settings(tmp_path, 0), board=worker_reported(GroupBoard(2, TOKEN), 30))

    def crash() -> None:
        w.hold_gpus(w.server, seconds=25.0)  # unpinning takes a while
        w.server.crash_rank(1)

    w.events.call_at(READY_AT + 30.0, crash)
    with capture_logs() as logs, pytest.raises(GroupMustRecreate) as err:
        run.run()
    assert err.value.exit_code == 8
    assert str(err.value).startswith("the group must be recreated: rank_crash: ")
    assert len(w.launcher.started) == 1
    assert names(logs) == [
        *("launching", "loading", "warming", "ready", "unhealthy"),
        *("gpu_release_done", "fatal"),
    ]
    assert w.clock.now >= READY_AT + 30.0 + 25.0, "exit 8 came before the GPUs were free"
    ending = [e["event"] for e in logs][-2:]
    assert ending == ["group_must_recreate", "fatal"]
    assert logs[-1]["exit_code"] == 8
    state = w.store.load()
    assert (state.restart_count, state.last_failure) == (1, "rank_crash")


def test_a_worker_that_loses_its_leader_kills_its_tree_and_ends_with_exit_8(tmp_path, listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))
    leader.board.record_own(report(0))
    w = world(tmp_path)
    start = node_settings(tmp_path, 1, failure_threshold=1)

    def unreachable(_url: str, _timeout_s: float) -> group_http.Answer:
        raise group_http.Unreachable("connection refused")

    watch = leader_watch(start, get=unreachable, clock=w.clock)
    assert watch is not None

    def asked_once_serving(server, post, info) -> Idle:  # the watch's thread, on the fake clock
        component = watch(server, post, info)
        assert isinstance(component, LeaderWatch)

        def ask() -> None:
            assert component.ask_once() is True  # a threshold of 1: lost at the first miss

        w.events.call_at(READY_AT + 30.0, ask)
        return Idle()

    run = node(w, start, link=leader.link(), watch_gpus=False)
    run.plugins = Plugins(components=(asked_once_serving,))
    with capture_logs() as logs, pytest.raises(GroupMustRecreate) as err:
        run.run()
    assert err.value.exit_code == 8
    assert str(err.value).startswith("the group must be recreated: peer_lost: ")
    assert len(w.launcher.started) == 1
    assert w.server.kill_reason is not None
    assert w.server.kill_reason.failure is FailureKind.PEER_LOST
    failed = next(e for e in logs if e["event"] == "server_failed")
    assert failed["failure"] == "peer_lost"  # why the tree was killed, not how it died
    assert [e["event"] for e in logs].count("group_leader_lost") == 1
    assert "restarting" not in [e["event"] for e in logs]
    assert w.store.load().last_failure == "peer_lost"


class Idle:
    """A component with nothing of its own to run."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = 0.0) -> None: ...


def test_the_group_hicache_size_is_what_gets_launched(tmp_path):
    w = world(tmp_path)
    board = worker_reported(GroupBoard(2, TOKEN), size_gb=30)
    run = node(w, node_settings(tmp_path, 0, size_gb=40), board=board, watch_gpus=False)
    w.events.at(READY_AT + 5.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    argv = w.launcher.argvs[0]
    assert argv[argv.index("--hicache-size") + 1] == "30"
    applied = next(e for e in logs if e["event"] == "group_hicache_applied")
    assert (applied["hicache_size_gb"], applied["own_gb"]) == (30, 40)
    decision = next(e for e in logs if e["event"] == "group_decision")
    assert (decision["state"], decision["hicache_size_gb"]) == ("launch", 30)
    assert board.snapshot()["reports"]["0"]["hicache_size_gb"] == 40


def test_sglang_rejecting_its_flags_keeps_exit_3(tmp_path):
    w = world(tmp_path)

    def reject(server) -> None:
        server.lines += ["launch_server.py: error: unrecognized arguments: --x"]
        w.events.call_at(w.clock.now + 0.5, lambda: server.exit_by_itself(2))

    w.launcher.on_start = reject
    run = node(w, node_settings(tmp_path, 0), board=worker_reported(GroupBoard(2, TOKEN)))
    with capture_logs() as logs, pytest.raises(ServerArgsRejected) as err:
        run.run()
    assert err.value.exit_code == 3
    assert "group_must_recreate" not in [e["event"] for e in logs]


def test_a_crash_loop_across_recreations_keeps_exit_5(tmp_path):
    w = world(tmp_path)
    w.store.ensure_writable()
    w.store.update(
        lambda s: dataclasses.replace(s, restart_count=1, restart_times=(w.clock.wall() - 60.0,))
    )
    start = node_settings(tmp_path, 0, max_restarts=1)
    run = node(w, start, board=worker_reported(GroupBoard(2, TOKEN)), watch_gpus=False)
    w.events.call_at(READY_AT + 30.0, lambda: w.server.crash_rank(0))
    with pytest.raises(CrashLoop) as err:
        run.run()
    assert err.value.exit_code == 5
    assert len(w.launcher.started) == 1


def test_a_recreated_node_waits_the_backoff_its_last_failure_earned_before_it_starts(tmp_path):
    w = world(tmp_path)
    w.store.ensure_writable()
    w.store.update(
        lambda s: dataclasses.replace(
            s,
            restart_count=2,
            restart_times=(w.clock.wall() - 300.0, w.clock.wall() - 4.0),
            last_failure="memory_kill",
        )
    )
    start = node_settings(tmp_path, 0, backoff_initial_s=10.0, backoff_max_s=300.0)
    run = node(w, start, board=worker_reported(GroupBoard(2, TOKEN)), watch_gpus=False)
    launched_at: list[float] = []
    w.launcher.on_start = lambda _server: launched_at.append(w.clock.now)
    began = w.clock.now
    w.events.at(READY_AT + 60.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    delayed = next(e for e in logs if e["event"] == "group_start_delayed")
    # two restarts in the window earn 10 s x 2; the last was 4 s ago
    assert (delayed["delay_s"], delayed["restarts_in_window"]) == (16.0, 2)
    assert delayed["last_failure"] == "memory_kill"
    assert launched_at
    assert launched_at[0] - began >= 16.0  # on the fake clock: the wait was waited


def test_a_node_whose_last_failure_is_older_than_its_backoff_starts_at_once(tmp_path):
    w = world(tmp_path)
    w.store.ensure_writable()
    w.store.update(lambda s: dataclasses.replace(s, restart_times=(w.clock.wall() - 60.0,)))
    start = node_settings(tmp_path, 0, backoff_initial_s=10.0)
    run = node(w, start, board=worker_reported(GroupBoard(2, TOKEN)), watch_gpus=False)
    w.events.at(READY_AT + 5.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert "group_start_delayed" not in [e["event"] for e in logs]


def test_a_worker_that_never_reports_ends_the_leader_with_exit_8_before_any_launch(tmp_path):
    w = world(tmp_path)
    run = node(w, node_settings(tmp_path, 0), board=GroupBoard(2, TOKEN), timeout_s=90.0)
    with capture_logs() as logs, pytest.raises(GroupMustRecreate) as err:
        run.run()
    assert "node 1 did not report within 1.5 min ([group] report_timeout)" in str(err.value)
    assert w.launcher.started == []
    assert [e["event"] for e in logs].count("group_waiting") == 3  # at 0, 30 and 60 s


def test_the_leaders_own_refusal_refuses_the_group_and_waits_for_the_workers_to_hear(tmp_path):
    w = world(tmp_path)
    board = GroupBoard(2, TOKEN)
    run = node(w, node_settings(tmp_path, 0, size_gb=300), board=board)

    def worker_polls() -> None:  # answered `refused`
        worker_reported(board)

    w.events.call_at(4.0, worker_polls)
    with capture_logs() as logs, pytest.raises(PreflightFailed) as err:
        run.run()
    assert err.value.exit_code == 1
    assert w.launcher.started == []
    decision = board.decision()
    assert (decision.state, decision.refused_nodes) == (DecisionState.REFUSED, (0,))
    assert "node 0 (node-0) does not fit (host_memory" in decision.reason
    assert "host memory: needs" in decision.reason
    refused = next(e for e in logs if e["event"] == "group_refused")
    assert refused["refused_nodes"] == [0]
    assert 4.0 <= w.clock.now < 30.0, "the leader lingered after every worker knew"


def test_a_worker_that_does_not_fit_tells_the_leader_and_exits_1(tmp_path, listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))
    w = world(tmp_path)
    run = node(w, node_settings(tmp_path, 1, size_gb=300), link=leader.link())
    with pytest.raises(PreflightFailed) as err:
        run.run()
    assert err.value.exit_code == 1
    assert "the pre-flight refuses this launch" in str(err.value)
    assert w.launcher.started == []
    decision = leader.board.decision()
    assert (decision.state, decision.refused_nodes) == (DecisionState.REFUSED, (1,))
    assert "node 1 (node-1) does not fit" in decision.reason


def test_a_worker_refused_by_the_group_exits_1_with_the_leaders_reason(tmp_path, listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))
    leader.board.record_own(report(0, fits=False, host="lead-pod"))
    w = world(tmp_path)
    run = node(w, node_settings(tmp_path, 1), link=leader.link())
    with pytest.raises(PreflightFailed) as err:
        run.run()
    assert "node 0 (lead-pod) does not fit" in str(err.value)
    assert w.launcher.started == []


def test_a_stop_signal_while_the_worker_waits_ends_the_run_with_0(tmp_path, listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))  # the leader is still in its pre-flight
    w = world(tmp_path)
    run = node(w, node_settings(tmp_path, 1), link=leader.link())
    w.events.at(5.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert w.launcher.started == []
    assert names(logs) == ["stopped"]  # nothing was launched: nothing to drain


def test_a_leader_address_that_never_resolves_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(group_http, "resolves", lambda _host: False)
    w = world(tmp_path)
    group = GroupConfig(resolve_timeout_s=20.0)
    run = node(w, node_settings(tmp_path, 1, group=group), link=None)
    with pytest.raises(ConfigError) as err:
        run.run()
    assert "the leader address 127.0.0.1 does not resolve after 20 s" in str(err.value)
    assert w.launcher.started == []


def test_a_reload_that_would_relaunch_the_server_is_refused(tmp_path):
    start = node_settings(tmp_path, 0)
    new = dataclasses.replace(
        start,
        server_args=(*start.server_args, "--max-running-requests", "8"),
        config=dataclasses.replace(
            start.config, run=dataclasses.replace(start.config.run, restart_on_reload=True)
        ),
    )
    w = world(tmp_path)
    run = node(w, start, board=worker_reported(GroupBoard(2, TOKEN)), watch_gpus=False)
    run.io = dataclasses.replace(run.io, reload_settings=lambda: new)
    w.events.at(READY_AT + 5.0, SIGHUP)
    w.events.at(READY_AT + 10.0, SIGTERM)
    with capture_logs() as logs:
        assert run.run() == 0
    assert len(w.launcher.started) == 1
    refused = next(e for e in logs if e["event"] == "reload_refused")
    assert "a relaunch in place breaks the group" in refused["reason"]
    assert "reloaded" not in [e["event"] for e in logs]


@pytest.fixture(scope="module")
def listener():
    with listening() as served:
        yield served
