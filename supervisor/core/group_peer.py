"""A worker's reading of its leader (pure): is the leader's supervisor still the live one this
node launched with?

SGLang gives a worker node no way to tell: its `/health` on `--node-rank` >= 1 is a dummy 200,
and when the leader's ranks die the worker's ranks hang in NCCL without exiting. So the worker's
supervisor asks the leader's `/healthz` beside each launch; each answer is read here.

A miss is an answer that is not 200 (the leader's tree died or is being killed), no answer at
all, or a 200 from another supervisor than the first one answered (the leader was restarted, by
systemd say: its new run waits for reports the old group's worker will never send). Misses are
counted from the launch on: a worker launches only on the leader's decision, served by the same
listener, so the leader was there when the launch began and a miss from the first question on
is real.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from supervisor.core.bounded import parse_json

# The key of /healthz naming the answering supervisor process (group/health.py): new at every
# start of a supervisor, so a restarted leader is told from the one this node launched with.
SUPERVISOR_ID_KEY = "supervisor_id"


@dataclass(frozen=True, slots=True)
class LeaderSeen:
    """What a worker knows of its leader during one launch."""

    misses: int = 0  # consecutive
    joined: str | None = None  # the supervisor_id of the first 200 (the leader launched with)
    last_answer: str = "none yet"


def after_answer(seen: LeaderSeen, status: int | None, body: bytes, why: str = "") -> LeaderSeen:
    """`seen` after one question: `status` None when no answer came (`why` says why)."""
    if status is None:
        return _miss(seen, f"no answer: {why}" if why else "no answer")
    if status != 200:
        reason = _field(body, "reason")
        return _miss(seen, f"HTTP {status}" + (f": {reason}" if reason else ""))
    supervisor_id = _field(body, SUPERVISOR_ID_KEY)
    if seen.joined is None:
        return LeaderSeen(misses=0, joined=supervisor_id or None, last_answer="HTTP 200")
    if supervisor_id != seen.joined:
        return _miss(
            seen,
            f"HTTP 200 from another supervisor ({supervisor_id or 'unnamed'}; this node "
            f"launched with {seen.joined}): the leader was restarted",
        )
    return replace(seen, misses=0, last_answer="HTTP 200")


def leader_lost(seen: LeaderSeen, threshold: int) -> bool:
    """`threshold` consecutive misses: the leader is gone, or is not the one this node joined."""
    return seen.misses >= threshold


def _miss(seen: LeaderSeen, answer: str) -> LeaderSeen:
    return replace(seen, misses=seen.misses + 1, last_answer=answer)


def _field(body: bytes, key: str) -> str:
    """A string field of a JSON object body ("" for anything else)."""
    try:
        data = parse_json(body)
    except ValueError:  # also UnicodeDecodeError, and nesting past 64 levels
        return ""
    value = data.get(key) if isinstance(data, dict) else None
    return value[:300] if isinstance(value, str) else ""
