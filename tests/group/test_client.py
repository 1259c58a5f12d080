"""A worker's report/poll loop against a real leader board over loopback HTTP, on a fake clock:
launch, refused, a leader that is not up yet, no decision in time (exit 8), a stop signal
during the wait (exit 0), and the answers that asking again cannot change (exit 2)."""

from __future__ import annotations

import signal
import socket

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.http_server import HttpListener, Request, Response
from supervisor.core.events import SignalEvent
from supervisor.core.group_report import DecisionState
from supervisor.errors import ConfigError, GroupMustRecreate
from supervisor.group.board import GroupBoard
from supervisor.group.client import LeaderLink, await_decision
from supervisor.run.events import EventClock, StopRequested
from tests.fakes import FakeClock, FakeEvents
from tests.group.support import TOKEN, leader_on, listening, post_json, report

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


@pytest.fixture(scope="module")
def listener():
    with listening() as served:
        yield served


def wait_clock() -> tuple[EventClock, FakeEvents]:
    clock = FakeClock(start_s=0.0)
    events = FakeEvents(clock)
    return EventClock(clock, events), events


def test_the_worker_launches_when_the_leader_decides_so(listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))
    leader.board.record_own(report(0, size_gb=30))
    clock, _events = wait_clock()
    with capture_logs() as logs:
        decision = await_decision(
            leader.link(), report(1), group_size=2, clock=clock, timeout_s=60.0
        )
    assert (decision.state, decision.hicache_size_gb) == (DecisionState.LAUNCH, 30)
    sent = [e for e in logs if e["event"] == "group_report_sent"]
    assert len(sent) == 1
    assert sent[0]["leader"] == leader.report_url
    assert leader.board.snapshot()["reports"]["1"]["host"] == "node-1"


def test_the_worker_polls_while_the_leader_waits_for_its_own_preflight(listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))
    clock, events = wait_clock()

    def leader_done() -> None:
        leader.board.record_own(report(0))

    events.call_at(3.5, leader_done)
    decision = await_decision(leader.link(), report(1), group_size=2, clock=clock, timeout_s=60.0)
    assert decision.state is DecisionState.LAUNCH
    assert 3.5 <= clock.monotonic() <= 5.0  # asked again every second


def test_the_worker_gets_the_leaders_refusal(listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))
    leader.board.record_own(report(0, fits=False, host="lead-pod"))
    clock, _events = wait_clock()
    decision = await_decision(leader.link(), report(1), group_size=2, clock=clock, timeout_s=60.0)
    assert decision.state is DecisionState.REFUSED
    assert "node 0 (lead-pod) does not fit" in decision.reason


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_leader_that_is_not_listening_yet_is_asked_again_until_it_is():
    port = free_port()
    board = GroupBoard(2, TOKEN)
    board.record_own(report(0))
    late = HttpListener("127.0.0.1", port)
    board.serve_on(late)
    clock, events = wait_clock()

    def leader_up() -> None:  # connection refused until then
        late.start()

    events.call_at(4.0, leader_up)
    link = LeaderLink(f"http://127.0.0.1:{port}/group/report", TOKEN, post_json)
    try:
        decision = await_decision(link, report(1), group_size=2, clock=clock, timeout_s=60.0)
    finally:
        late.close()
    assert decision.state is DecisionState.LAUNCH
    assert 4.0 <= clock.monotonic() <= 5.0


def test_a_leader_answering_something_else_is_asked_again():
    board = GroupBoard(2, TOKEN)
    board.record_own(report(0))
    clock, events = wait_clock()
    with listening() as listener:
        listener.route("/group/report", _not_up_yet, methods=("POST",))
        link = LeaderLink(f"http://127.0.0.1:{listener.port}/group/report", TOKEN, post_json)

        def board_up() -> None:
            board.serve_on(listener)

        events.call_at(4.0, board_up)
        decision = await_decision(link, report(1), group_size=2, clock=clock, timeout_s=60.0)
    assert decision.state is DecisionState.LAUNCH
    assert clock.monotonic() >= 4.0


def _not_up_yet(_request: Request) -> Response:
    return Response(503, b"starting\n")


def test_an_unreachable_leader_ends_the_wait_with_exit_8_after_report_timeout():
    clock, _events = wait_clock()
    link = LeaderLink(f"http://127.0.0.1:{free_port()}/group/report", TOKEN, post_json)
    with pytest.raises(GroupMustRecreate) as err:
        await_decision(link, report(1), group_size=2, clock=clock, timeout_s=5.0)
    assert err.value.exit_code == 8
    message = str(err.value)
    assert "no launch decision from the leader within 5 s ([group] report_timeout)" in message
    assert "does not answer: connection refused" in message
    assert 5.0 <= clock.monotonic() <= 6.0


def test_a_leader_still_waiting_for_another_node_ends_the_wait_with_exit_8(listener):
    leader = leader_on(listener, GroupBoard(3, TOKEN))
    leader.board.record_own(report(0))
    clock, _events = wait_clock()
    with pytest.raises(GroupMustRecreate, match="waiting for the report of node 2"):
        await_decision(leader.link(), report(1), group_size=3, clock=clock, timeout_s=3.0)


def test_a_stop_signal_during_the_wait_ends_it(listener):
    leader = leader_on(listener, GroupBoard(3, TOKEN))  # never decides: node 2 never comes
    clock, events = wait_clock()
    events.at(2.5, SIGTERM)
    with pytest.raises(StopRequested):
        await_decision(leader.link(), report(1), group_size=3, clock=clock, timeout_s=600.0)
    assert clock.monotonic() == pytest.approx(2.5)


def test_a_wrong_token_is_bad_input_at_once(listener):
    leader = leader_on(listener, GroupBoard(2, TOKEN))
    clock, _events = wait_clock()
    with pytest.raises(ConfigError, match="refuses this node's group token"):
        await_decision(
            leader.link("other-token-123"), report(1), group_size=2, clock=clock, timeout_s=60.0
        )
    assert clock.monotonic() == 0.0


def test_a_report_the_leader_refuses_to_read_is_bad_input_at_once(listener):
    leader = leader_on(listener, GroupBoard(3, TOKEN))
    clock, _events = wait_clock()
    with pytest.raises(ConfigError, match="the report says the group has 2 nodes"):
        await_decision(leader.link(), report(1), group_size=2, clock=clock, timeout_s=60.0)


def test_another_pod_holding_this_rank_means_the_group_must_be_recreated(listener):
    leader = leader_on(listener, GroupBoard(3, TOKEN))
    leader.board.record_own(report(0))
    assert leader.post({"version": 1, "nnodes": 3, **report(1, host="old-pod").to_json()}).ok
    clock, _events = wait_clock()
    with pytest.raises(GroupMustRecreate, match="already reported from old-pod"):
        await_decision(leader.link(), report(1), group_size=3, clock=clock, timeout_s=60.0)
