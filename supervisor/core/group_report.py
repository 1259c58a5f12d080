"""The group's one launch decision: each node's pre-flight report, the leader's verdict over all
of them, their wire format, and the group token's check. Pure: bytes in, values out.

Workers POST their NodeReport to the leader; the leader answers every POST with decide_group's
verdict over the reports it holds. The bodies come from the network: parse_report and
parse_decision accept exactly the documented shape and say what is wrong with anything else.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import unicodedata
from collections.abc import Mapping
from enum import Enum
from typing import Any

from supervisor.core.bounded import TooDeep, parse_json

REPORT_VERSION = 1
MAX_TEXT_CHARS = 1000  # one summary line, a hostname, a check's name
MIN_TOKEN_CHARS = 8  # core.redact.MIN_ENV_SECRET_LEN: a shorter value would escape the masking

_FROZEN: dict[str, Any] = {"frozen": True, "slots": True}


class ReportError(ValueError):
    """A report or decision body that is not the documented shape (the text of a 400)."""


@dataclasses.dataclass(**_FROZEN)
class NodeReport:
    """One node's pre-flight verdict, sent to the leader before anything is launched."""

    node_rank: int
    host: str  # the node's hostname, for messages
    fits: bool  # the pre-flight's verdict (forced => True)
    # The --hicache-size this node would launch with (after its own override or auto-size);
    # None: no HiCache, or not a fixed size.
    hicache_size_gb: int | None
    host_required_bytes: int | None
    host_budget_bytes: int | None
    failed_checks: tuple[str, ...]
    summary: str  # one line of arithmetic

    def to_json(self) -> dict[str, object]:
        return {
            "node_rank": self.node_rank,
            "host": self.host,
            "fits": self.fits,
            "hicache_size_gb": self.hicache_size_gb,
            "host_required_bytes": self.host_required_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "failed_checks": list(self.failed_checks),
            "summary": self.summary,
        }


def encode_report(report: NodeReport, *, group_size: int) -> bytes:
    """The body a worker POSTs: {"version": 1, "nnodes": <size>, **report.to_json()}."""
    wire = {"version": REPORT_VERSION, "nnodes": group_size, **report.to_json()}
    return json.dumps(wire).encode("utf-8")


class DecisionState(str, Enum):
    WAITING = "waiting"
    LAUNCH = "launch"
    REFUSED = "refused"


@dataclasses.dataclass(**_FROZEN)
class GroupDecision:
    """The leader's answer: wait, launch (with the group's --hicache-size), or refuse."""

    state: DecisionState
    # LAUNCH: the smallest of the nodes' fixed sizes; None: leave each argv as it is.
    hicache_size_gb: int | None = None
    refused_nodes: tuple[int, ...] = ()
    # REFUSED: every refusing node, its host and its summary; WAITING: who is missing.
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "hicache_size_gb": self.hicache_size_gb,
            "refused_nodes": list(self.refused_nodes),
            "reason": self.reason,
        }


def missing_nodes(size: int, reports: Mapping[int, NodeReport]) -> tuple[int, ...]:
    """The node ranks 0..size-1 with no report yet."""
    return tuple(rank for rank in range(size) if rank not in reports)


def decide_group(size: int, reports: Mapping[int, NodeReport]) -> GroupDecision:
    """One refusal refuses the group at once (waiting for the others cannot change that); every
    node fitting launches it, with the smallest fixed --hicache-size any node can afford."""
    in_group = {rank: report for rank, report in reports.items() if 0 <= rank < size}
    refused = sorted(rank for rank, report in in_group.items() if not report.fits)
    if refused:
        return GroupDecision(
            DecisionState.REFUSED,
            refused_nodes=tuple(refused),
            reason="the group does not fit: "
            + "; ".join(_refusal(in_group[rank]) for rank in refused),
        )
    missing = missing_nodes(size, in_group)
    if missing:
        return GroupDecision(
            DecisionState.WAITING,
            reason=f"waiting for the report of node {_ranks(missing)} ({len(in_group)} of "
            f"{size} reported)",
        )
    sizes = [r.hicache_size_gb for r in in_group.values() if r.hicache_size_gb is not None]
    return GroupDecision(DecisionState.LAUNCH, hicache_size_gb=min(sizes) if sizes else None)


def launch_hicache_gb(own_gb: int | None, decision: GroupDecision) -> int | None:
    """The --hicache-size this node must launch with instead of its own, or None to keep its
    argv: only a fixed size larger than the group's is lowered (smaller needs less host memory,
    so the node's verdict holds); no HiCache, or a size SGLang picks, stays as it is."""
    group_gb = decision.hicache_size_gb
    if group_gb is None or own_gb is None or own_gb <= group_gb:
        return None
    return group_gb


def _refusal(report: NodeReport) -> str:
    checks = f" ({', '.join(report.failed_checks)})" if report.failed_checks else ""
    summary = f": {report.summary}" if report.summary else ""
    return f"node {report.node_rank} ({report.host}) does not fit{checks}{summary}"


def _ranks(ranks: tuple[int, ...]) -> str:
    return ", ".join(str(rank) for rank in ranks)


# -- the wire ------------------------------------------------------------------------------------

_REPORT_KEYS = frozenset({"version", "nnodes", *(f.name for f in dataclasses.fields(NodeReport))})
_DECISION_KEYS = frozenset(f.name for f in dataclasses.fields(GroupDecision))


def parse_report(body: bytes, *, group_size: int) -> NodeReport:
    """A worker's POSTed report, checked against this group.

    Raises:
        ReportError: not a JSON object, a key unknown or missing, a value of the wrong type or
            range, a node_rank outside 1..group_size-1, another version, another group size,
            a string over MAX_TEXT_CHARS or with control characters.
    """
    obj = _load_object(body, "report")
    version = obj.get("version")
    if "version" in obj and version != REPORT_VERSION:
        raise ReportError(
            f"report version {_show(version)} is not supported (this supervisor speaks "
            f"version {REPORT_VERSION}): run the same supervisor version on every node"
        )
    _check_keys(obj, _REPORT_KEYS, "report")
    nnodes = _integer(obj, "nnodes", "report", minimum=1)
    if nnodes != group_size:
        raise ReportError(
            f"the report says the group has {nnodes} nodes but this leader's group has "
            f"{group_size}: every node must see the same group size"
        )
    node_rank = _integer(obj, "node_rank", "report", minimum=0)
    if not 1 <= node_rank < group_size:
        raise ReportError(
            f"report key node_rank {node_rank} is not a worker of a group of {group_size} "
            f"(1 to {group_size - 1})"
        )
    host = _text(obj, "host", "report")
    if not host:
        raise ReportError("report key host is empty")
    return NodeReport(
        node_rank=node_rank,
        host=host,
        fits=_boolean(obj, "fits", "report"),
        hicache_size_gb=_optional_integer(obj, "hicache_size_gb", "report", minimum=1),
        host_required_bytes=_optional_integer(obj, "host_required_bytes", "report", minimum=0),
        host_budget_bytes=_optional_integer(obj, "host_budget_bytes", "report", minimum=0),
        failed_checks=_text_list(obj, "failed_checks", "report"),
        summary=_text(obj, "summary", "report"),
    )


def parse_decision(body: bytes) -> GroupDecision:
    """The leader's answer as a worker reads it.

    Raises:
        ReportError: not a JSON object, an unknown key, no state, a value of the wrong type.
    """
    obj = _load_object(body, "decision")
    _check_keys(obj, _DECISION_KEYS, "decision", required=("state",))
    state_text = obj["state"]
    states = {state.value: state for state in DecisionState}
    if not isinstance(state_text, str) or state_text not in states:
        raise ReportError(
            f"decision key state must be one of {'|'.join(states)} (got {_show(state_text)})"
        )
    refused = obj.get("refused_nodes", [])
    if not isinstance(refused, list) or not all(_is_int(r) and r >= 0 for r in refused):
        raise ReportError(
            f"decision key refused_nodes must be a list of node ranks (got {_show(refused)})"
        )
    reason = obj.get("reason", "")
    if not isinstance(reason, str):
        raise ReportError(f"decision key reason must be a string (got {_show(reason)})")
    return GroupDecision(
        states[state_text],
        hicache_size_gb=_optional_integer(obj, "hicache_size_gb", "decision", minimum=1),
        refused_nodes=tuple(refused),
        reason=reason,
    )


def _load_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        obj = parse_json(body.decode("utf-8"))
    except TooDeep as exc:
        raise ReportError(f"the {what} is not the documented JSON object ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ReportError(f"the {what} is not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"the {what} is not JSON: {exc}") from None
    except ValueError:  # an integer of more digits than int() takes (sys.int_info)
        raise ReportError(f"the {what} is not the documented JSON object (a huge number)") from None
    except RecursionError:  # "[[[[...": nested deeper than the decoder goes
        raise ReportError(
            f"the {what} is not the documented JSON object (nested too deep)"
        ) from None
    if not isinstance(obj, dict):
        raise ReportError(f"the {what} is not a JSON object (got {type(obj).__name__})")
    return obj


def _check_keys(
    obj: Mapping[str, Any], known: frozenset[str], what: str, required: tuple[str, ...] = ()
) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        names = ", ".join(_show(key) for key in unknown[:5])
        raise ReportError(f"unknown key(s) in the {what}: {names}")
    missing = sorted((set(required) if required else known) - set(obj))
    if missing:
        raise ReportError(f"the {what} lacks key(s): {', '.join(missing)}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(obj: Mapping[str, Any], key: str, what: str, *, minimum: int) -> int:
    value = obj[key]
    if not _is_int(value) or value < minimum:
        raise ReportError(
            f"{what} key {key} must be an integer of at least {minimum} (got {_show(value)})"
        )
    result: int = value
    return result


def _optional_integer(obj: Mapping[str, Any], key: str, what: str, *, minimum: int) -> int | None:
    if obj.get(key) is None:
        return None
    return _integer(obj, key, what, minimum=minimum)


def _boolean(obj: Mapping[str, Any], key: str, what: str) -> bool:
    value = obj[key]
    if not isinstance(value, bool):
        raise ReportError(f"{what} key {key} must be true or false (got {_show(value)})")
    return value


def _text(obj: Mapping[str, Any], key: str, what: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise ReportError(f"{what} key {key} must be a string (got {_show(value)})")
    problem = _text_problem(value)
    if problem:
        raise ReportError(f"{what} key {key} {problem}")
    return value


def _text_list(obj: Mapping[str, Any], key: str, what: str) -> tuple[str, ...]:
    value = obj[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ReportError(f"{what} key {key} must be a list of strings (got {_show(value)})")
    for item in value:
        problem = _text_problem(item)
        if problem:
            raise ReportError(f"an entry of {what} key {key} {problem}")
    return tuple(value)


def _text_problem(text: str) -> str | None:
    """Why a string from another node cannot go into a log line, or None."""
    if len(text) > MAX_TEXT_CHARS:
        return f"is longer than {MAX_TEXT_CHARS} characters ({len(text)})"
    # Control characters would forge log lines; lone surrogates cannot be written as UTF-8.
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text):
        return "contains control characters"
    return None


def _show(value: object) -> str:
    """A value from the network, short enough for one message."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


# -- the token -----------------------------------------------------------------------------------


def token_matches(given: str, expected: str) -> bool:
    """Whether a request's token is the group's, in constant time; never with no token set."""
    if not expected:
        return False
    # surrogatepass: any str encodes, so a strange header cannot raise here.
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def token_problem(token: str) -> str | None:
    """Why `token` cannot be the group token, or None; the message never shows the token."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"must be at least {MIN_TOKEN_CHARS} characters long"
    # It travels as `Authorization: Bearer <token>`: one header word.
    if not all("!" <= ch <= "~" for ch in token):
        return "must be printable ASCII characters without spaces"
    return None
