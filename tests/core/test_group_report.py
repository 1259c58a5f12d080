"""The group's launch decision, pure: a worker's report read off the wire (anything else is a
clear 400), the leader's verdict over every node's report, the decision read back by a worker,
and the group token compared."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.group import (
    REPORT_VERSION,
    DecisionState,
    GroupDecision,
    NodeReport,
    ReportError,
    decide_group,
    parse_decision,
    parse_report,
    token_matches,
)
from supervisor.core.group_report import (
    encode_report,
    launch_hicache_gb,
    missing_nodes,
    token_problem,
)


def report(rank: int, *, fits: bool = True, size: int | None = 48, **more: Any) -> NodeReport:
    fields: dict[str, Any] = {
        "node_rank": rank,
        "host": f"pod-{rank}",
        "fits": fits,
        "hicache_size_gb": size,
        "host_required_bytes": 412_000_000_000,
        "host_budget_bytes": 440_000_000_000,
        "failed_checks": () if fits else ("host_memory",),
        "summary": f"host memory: needs 412.0 GB of 440.0 GB (node {rank})",
    }
    fields.update(more)
    return NodeReport(**fields)


def wire(rank: int = 1, *, nnodes: int = 4, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"version": REPORT_VERSION, "nnodes": nnodes, **report(rank).to_json()}
    body.update(changes)
    return body


def parse(body: dict[str, Any] | bytes, size: int = 4) -> NodeReport:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_report(raw, group_size=size)


def rejected(body: dict[str, Any] | bytes, size: int = 4) -> str:
    with pytest.raises(ReportError) as err:
        parse(body, size)
    return str(err.value)


# -- reports on the wire -------------------------------------------------------------------------


def test_a_report_sent_is_the_report_read():
    sent = report(3, fits=False, size=None, host_required_bytes=None)
    assert parse_report(encode_report(sent, group_size=4), group_size=4) == sent
    assert json.loads(encode_report(sent, group_size=4))["version"] == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "the report is not JSON"),
        (b"\xff\xfe", "the report is not UTF-8"),
        (b"", "the report is not JSON"),
        (b"[1, 2]", "the report is not a JSON object (got list)"),
        (b"null", "the report is not a JSON object (got NoneType)"),
        (b"[" * 100_000 + b"]" * 100_000, "the report is not the documented JSON object"),
        (b'{"version": ' + b"1" * 5000 + b"}", "the report is not the documented JSON object"),
        (wire(extra=1), "unknown key(s) in the report: 'extra'"),
        ({k: v for k, v in wire().items() if k != "summary"}, "the report lacks key(s): summary"),
        (wire(version=2), "report version 2 is not supported (this supervisor speaks version 1)"),
        (wire(version="1"), "report version '1' is not supported"),
        (wire(nnodes=3), "the report says the group has 3 nodes but this leader's group has 4"),
        (wire(nnodes=True), "report key nnodes must be an integer"),
        (wire(node_rank=0), "report key node_rank 0 is not a worker of a group of 4 (1 to 3)"),
        (wire(node_rank=4), "report key node_rank 4 is not a worker"),
        (wire(node_rank=-1), "report key node_rank must be an integer of at least 0 (got -1)"),
        (wire(node_rank=1.0), "report key node_rank must be an integer"),
        (wire(fits="yes"), "report key fits must be true or false (got 'yes')"),
        (wire(fits=1), "report key fits must be true or false"),
        (wire(hicache_size_gb=0), "report key hicache_size_gb must be an integer of at least 1"),
        (wire(hicache_size_gb="48"), "report key hicache_size_gb must be an integer"),
        (wire(host_required_bytes=-5), "report key host_required_bytes must be an integer"),
        (wire(host_budget_bytes=[]), "report key host_budget_bytes must be an integer"),
        (wire(failed_checks="host_memory"), "report key failed_checks must be a list of strings"),
        (wire(failed_checks=[1]), "report key failed_checks must be a list of strings"),
        (wire(host=None), "report key host must be a string (got None)"),
        (wire(host=""), "report key host is empty"),
        (wire(host="x" * 1001), "report key host is longer than 1000 characters (1001)"),
        (wire(summary="y" * 1001), "report key summary is longer than 1000 characters"),
        (wire(failed_checks=["z" * 1001]), "an entry of report key failed_checks is longer"),
        (wire(summary="fits\nfatal: forged"), "report key summary contains control characters"),
        (wire(host="pod\ud800"), "report key host contains control characters"),
    ],
)
def test_a_malformed_report_is_refused_saying_what_is_wrong(body, message):
    assert message in rejected(body)


def test_a_long_bad_value_is_shortened_in_the_message():
    message = rejected(wire(fits="a" * 5000))
    assert len(message) < 200


def test_a_report_at_the_length_limit_and_in_any_script_is_taken():
    parsed = parse(wire(host="h" * 1000, summary="mémoire hôte: 412 GB × 8 ≤ 440 GB"))
    assert parsed.host == "h" * 1000
    assert parsed.summary.startswith("mémoire")


@given(st.binary(max_size=300))
def test_any_bytes_give_a_report_or_a_report_error(body):
    try:
        parsed = parse_report(body, group_size=3)
    except ReportError:
        return
    assert 1 <= parsed.node_rank < 3


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=5),
    st.lists(st.integers() | st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


@given(key=st.sampled_from(sorted(wire())), value=JSON_VALUES)
def test_any_value_in_any_key_gives_a_valid_report_or_a_report_error(key, value):
    body = wire(**{key: value})
    try:
        parsed = parse(body)
    except ReportError:
        return
    assert parsed == NodeReport(**{k: v for k, v in body.items() if k not in ("version", "nnodes")}
                                | {"failed_checks": tuple(body["failed_checks"])})  # fmt: skip


# -- the decision --------------------------------------------------------------------------------


def test_the_decision_waits_naming_the_nodes_still_missing():
    decision = decide_group(4, {0: report(0), 2: report(2)})
    assert decision.state is DecisionState.WAITING
    assert decision.reason == "waiting for the report of node 1, 3 (2 of 4 reported)"
    assert missing_nodes(4, {0: report(0), 2: report(2)}) == (1, 3)


def test_every_node_fitting_launches_with_the_smallest_fixed_size():
    reports = {0: report(0, size=48), 1: report(1, size=None), 2: report(2, size=36)}
    assert decide_group(3, reports) == GroupDecision(DecisionState.LAUNCH, hicache_size_gb=36)


def test_with_no_fixed_size_anywhere_the_argv_stays_as_it_is():
    reports = {0: report(0, size=None), 1: report(1, size=None)}
    assert decide_group(2, reports) == GroupDecision(DecisionState.LAUNCH, hicache_size_gb=None)


def test_one_refusal_refuses_the_group_at_once_naming_each_refusing_node():
    reports = {
        0: report(0),
        2: report(2, fits=False, summary="host memory: needs 500.0 GB of 440.0 GB"),
        3: report(3, fits=False, failed_checks=(), summary=""),
    }
    decision = decide_group(5, reports)  # nodes 1 and 4 have not reported: no need to wait
    assert decision.state is DecisionState.REFUSED
    assert decision.refused_nodes == (2, 3)
    assert decision.reason == (
        "the group does not fit: node 2 (pod-2) does not fit (host_memory): host memory: needs "
        "500.0 GB of 440.0 GB; node 3 (pod-3) does not fit"
    )


def test_reports_outside_the_group_count_for_nothing():
    reports = {0: report(0), 1: report(1), 7: report(7, fits=False), -1: report(-1, size=1)}
    assert decide_group(2, reports) == GroupDecision(DecisionState.LAUNCH, hicache_size_gb=48)


@given(
    size=st.integers(1, 6),
    nodes=st.dictionaries(
        st.integers(0, 5), st.tuples(st.booleans(), st.none() | st.integers(1, 500)), max_size=6
    ),
)
def test_the_decision_follows_its_rules_for_any_reports(size, nodes):
    reports = {r: report(r, fits=f, size=s) for r, (f, s) in nodes.items()}
    decision = decide_group(size, reports)
    inside = {r: rep for r, rep in reports.items() if r < size}
    if any(not rep.fits for rep in inside.values()):
        assert decision.state is DecisionState.REFUSED
        assert all(f"node {r} (pod-{r})" in decision.reason for r in decision.refused_nodes)
    elif len(inside) < size:
        assert decision.state is DecisionState.WAITING
    else:
        sizes = [rep.hicache_size_gb for rep in inside.values() if rep.hicache_size_gb]
        assert decision == GroupDecision(DecisionState.LAUNCH, min(sizes) if sizes else None)
    assert parse_decision(json.dumps(decision.to_json()).encode()) == decision


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "the decision is not JSON"),
        (b'"launch"', "the decision is not a JSON object (got str)"),
        (b"{}", "the decision lacks key(s): state"),
        (b'{"state": "go"}', "decision key state must be one of waiting|launch|refused (got 'go')"),
        (b'{"state": "launch", "hicache_size_gb": -1}', "decision key hicache_size_gb must be"),
        (b'{"state": "refused", "refused_nodes": [true]}', "decision key refused_nodes must be"),
        (b'{"state": "refused", "refused_nodes": 2}', "decision key refused_nodes must be"),
        (b'{"state": "refused", "reason": 7}', "decision key reason must be a string"),
        (b'{"state": "waiting", "why": ""}', "unknown key(s) in the decision: 'why'"),
    ],
)
def test_a_malformed_decision_is_refused_saying_what_is_wrong(body, message):
    with pytest.raises(ReportError) as err:
        parse_decision(body)
    assert message in str(err.value)


def test_a_decision_may_leave_out_what_it_does_not_need():
    assert parse_decision(b'{"state": "waiting"}') == GroupDecision(DecisionState.WAITING)


# -- the token -----------------------------------------------------------------------------------


def test_only_the_group_s_own_token_matches():
    assert token_matches("s3cret-token", "s3cret-token")
    assert not token_matches("s3cret-tokeN", "s3cret-token")
    assert not token_matches("", "s3cret-token")
    assert not token_matches("s3cret-token-and-more", "s3cret-token")
    assert not token_matches("", "")  # no token set: nothing matches, not even nothing
    assert not token_matches("anything", "")
    assert not token_matches("bad\ud800", "s3cret-token")  # no encoding error either
    assert token_matches("jeton-été", "jeton-été")


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("1234567", "must be at least 8 characters long"),
        ("has space inside", "must be printable ASCII characters without spaces"),
        ("tab\tinside", "must be printable ASCII characters without spaces"),
        ("jeton-été-long", "must be printable ASCII characters without spaces"),
        ("abcdefgh", None),
        ("A-Za-z0-9._~+/=!", None),
    ],
)
def test_a_token_must_fit_in_one_header_word(token, problem):
    assert token_problem(token) == problem


@pytest.mark.parametrize(
    ("own_gb", "group_gb", "launched"),
    [(40, 30, 30), (30, 30, None), (20, 30, None), (None, 30, None), (40, None, None)],
)
def test_a_node_lowers_only_a_fixed_size_above_the_groups(own_gb, group_gb, launched):
    decision = GroupDecision(DecisionState.LAUNCH, hicache_size_gb=group_gb)
    assert launch_hicache_gb(own_gb, decision) == launched
