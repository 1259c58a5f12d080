"""The leader's board through the real listener: only the group's token and well-formed reports
from the group's own nodes get in; every POST is answered with the decision so far, which never
changes once it is launch or refused."""

from __future__ import annotations

import json

import pytest
import requests
from structlog.testing import capture_logs

from supervisor.core.group_report import DecisionState
from supervisor.group.board import MAX_REPORT_BYTES, GroupBoard
from tests.group.support import TOKEN, leader_on, listening, report, wire


@pytest.fixture(scope="module")
def listener():
    with listening() as served:
        yield served


@pytest.fixture
def leader(listener):
    return leader_on(listener, GroupBoard(3, TOKEN))


@pytest.mark.parametrize(
    "auth", [None, "Bearer wrong-token-xyz", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "]
)
def test_a_report_without_the_group_token_is_refused_and_not_recorded(leader, auth):
    answer = leader.post(wire(report(1), size=3), auth=auth)
    assert answer.status_code == 401
    assert "group token" in answer.text
    assert leader.board.snapshot()["reports"] == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "the report is not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (wire(report(0), size=3), "node_rank 0 is not a worker of a group of 3"),
        (wire(report(3), size=3), "node_rank 3 is not a worker"),
        (
            wire(report(1), size=2),
            "the report says the group has 2 nodes but this leader's group has 3",
        ),
        (wire(report(1), size=3, version=2), "report version 2 is not supported"),
        (wire(report(1), size=3, extra=1), "unknown key(s) in the report: 'extra'"),
        (wire(report(1), size=3, fits="yes"), "report key fits must be true or false"),
        (wire(report(1), size=3, summary="x" * 1001), "longer than 1000 characters"),
    ],
)
def test_a_malformed_report_is_a_400_naming_what_is_wrong(leader, body, message):
    answer = leader.post(body)
    assert answer.status_code == 400
    assert message in answer.text
    assert leader.board.snapshot()["reports"] == {}


def test_a_body_over_64_kib_is_a_413(leader):
    body = json.dumps(wire(report(1), size=3)).encode() + b" " * MAX_REPORT_BYTES
    assert leader.post(body).status_code == 413
    assert leader.board.snapshot()["reports"] == {}


def test_a_second_pod_claiming_a_reported_rank_is_a_409(leader):
    assert leader.post(wire(report(1, host="pod-a"), size=3)).status_code == 200
    answer = leader.post(wire(report(1, host="pod-b"), size=3))
    assert answer.status_code == 409
    assert "node 1 already reported from pod-a, not pod-b" in answer.text
    assert leader.board.snapshot()["reports"]["1"]["host"] == "pod-a"


def test_the_group_launches_once_every_node_fits_with_the_smallest_size(leader):
    leader.board.record_own(report(0, size_gb=48))
    with capture_logs() as logs:
        first = leader.post(wire(report(1, size_gb=40), size=3))
        again = leader.post(wire(report(1, size_gb=40), size=3))  # the worker's poll
    assert first.status_code == again.status_code == 200
    assert first.json()["state"] == "waiting"
    assert "node 2" in first.json()["reason"]
    assert [e["event"] for e in logs].count("group_report_received") == 1  # a poll is no news
    assert not leader.board.all_told()

    last = leader.post(wire(report(2, size_gb=32), size=3))
    assert last.json() == {
        "state": "launch",
        "hicache_size_gb": 32,
        "refused_nodes": [],
        "reason": "",
    }
    assert not leader.board.all_told()  # node 1 saw only `waiting` so far
    assert leader.post(wire(report(1, size_gb=40), size=3)).json()["state"] == "launch"
    assert leader.board.all_told()
    assert leader.board.decision().state is DecisionState.LAUNCH


def test_one_refusal_refuses_the_group_at_once_and_for_good(leader):
    refused = leader.post(wire(report(2, fits=False, host="gpu-b"), size=3)).json()
    assert refused["state"] == "refused"
    assert refused["refused_nodes"] == [2]
    assert (
        "node 2 (gpu-b) does not fit (host_memory): needs 500.0 GB of 440.0 GB"
        in (refused["reason"])
    )
    # Node 1 and the leader fitting later changes nothing.
    leader.board.record_own(report(0))
    assert leader.post(wire(report(1), size=3)).json()["state"] == "refused"
    assert leader.board.decision().state is DecisionState.REFUSED


def test_the_status_page_needs_the_token_and_shows_the_reports_and_the_decision(leader):
    leader.board.record_own(report(0))
    leader.post(wire(report(1), size=3))
    url = leader.report_url.replace("/report", "/status")
    assert requests.get(url, timeout=10).status_code == 401
    status = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    assert sorted(status["reports"]) == ["0", "1"]
    assert status["missing"] == [2]
    assert status["decision"]["state"] == "waiting"
    assert TOKEN not in json.dumps(status)


def test_a_get_on_the_report_path_is_405(leader):
    assert requests.get(leader.report_url, timeout=10).status_code == 405
