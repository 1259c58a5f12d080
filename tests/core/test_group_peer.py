"""core.group_peer: a worker's reading of its leader's /healthz answers (pure)."""

from __future__ import annotations

import json

from supervisor.core.group_peer import LeaderSeen, after_answer, leader_lost


def live(supervisor_id: str = "lead-1") -> bytes:
    return json.dumps({"live": True, "supervisor_id": supervisor_id}).encode()


def test_a_live_leader_is_joined_by_its_id_and_never_lost():
    seen = LeaderSeen()
    for _ in range(10):
        seen = after_answer(seen, 200, live())
    assert (seen.misses, seen.joined, seen.last_answer) == (0, "lead-1", "HTTP 200")
    assert not leader_lost(seen, 1)


def test_misses_in_a_row_lose_the_leader_and_an_answer_in_between_resets_them():
    seen = after_answer(LeaderSeen(), 200, live())
    seen = after_answer(seen, None, b"", "connection refused")
    seen = after_answer(seen, 503, b'{"live": false, "reason": "server unhealthy: rank_crash"}')
    assert (seen.misses, leader_lost(seen, 3)) == (2, False)
    assert seen.last_answer == "HTTP 503: server unhealthy: rank_crash"
    seen = after_answer(seen, 200, live())
    assert seen.misses == 0
    for _ in range(3):
        seen = after_answer(seen, None, b"", "connection refused")
    assert leader_lost(seen, 3)
    assert seen.last_answer == "no answer: connection refused"


def test_misses_from_the_first_question_count():
    # The worker launched on the leader's decision, served by this listener: it was there.
    seen = LeaderSeen()
    for _ in range(3):
        seen = after_answer(seen, None, b"", "no answer within 2 s")
    assert leader_lost(seen, 3)
    assert seen.joined is None


def test_a_restarted_leader_answering_200_is_not_the_one_this_node_launched_with():
    seen = after_answer(LeaderSeen(), 200, live("lead-1"))
    for _ in range(2):
        seen = after_answer(seen, 200, live("lead-2"))
    assert leader_lost(seen, 2)
    assert "another supervisor (lead-2; this node launched with lead-1)" in seen.last_answer
    assert seen.joined == "lead-1"


def test_an_answer_that_is_not_json_is_read_by_its_status():
    seen = after_answer(LeaderSeen(), 502, b"<html>bad gateway</html>")
    assert (seen.misses, seen.last_answer) == (1, "HTTP 502")
    seen = after_answer(seen, 200, b"\xff not json")
    assert (seen.misses, seen.joined) == (0, None)
