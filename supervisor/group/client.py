"""A worker's side of the group's launch decision: POST this node's report to the leader's
supervisor every second (the same report: the leader takes it once) until the answer is launch
or refused, or `report_timeout` passes.

Each wait between two POSTs is a sleep of the runner's EventClock, so SIGTERM during the wait
ends the run at once (StopRequested, exit 0), and systemd's watchdog stays fed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from supervisor.adapters.group_http import Answer, Unreachable
from supervisor.core.group_report import (
    REPORT_VERSION,
    DecisionState,
    GroupDecision,
    NodeReport,
    ReportError,
    parse_decision,
)
from supervisor.core.ports import Clock
from supervisor.errors import ConfigError, GroupMustRecreate
from supervisor.group.resolve import format_duration

log = structlog.get_logger("supervisor.group")

REPORT_EVERY_S = 1.0

# (url, JSON payload, token) -> the answer; raises Unreachable (adapters/group_http.post_json).
PostJson = Callable[[str, Mapping[str, object], str], Answer]


@dataclass(frozen=True, slots=True)
class LeaderLink:
    """Where this worker's leader listens, and how to reach it."""

    report_url: str
    token: str
    post: PostJson


def await_decision(
    link: LeaderLink,
    report: NodeReport,
    *,
    group_size: int,
    clock: Clock,
    timeout_s: float,
    every_s: float = REPORT_EVERY_S,
) -> GroupDecision:
    """POST `report` until the leader decides; its launch or refused decision.

    Raises:
        ConfigError: the leader refuses this node's token (401) or its report (400): the
            nodes are not configured alike.
        GroupMustRecreate: another pod reported as this node (409), or no decision within
            `timeout_s` (the leader unreachable, or still waiting for other nodes).
        StopRequested: a stop signal arrived during a wait (the clock's).
    """
    payload = report_payload(report, group_size)
    started = clock.monotonic()
    why = "no answer yet"
    delivered = False
    while True:
        try:
            answer = link.post(link.report_url, payload, link.token)
        except Unreachable as exc:
            why = f"the leader's supervisor at {link.report_url} does not answer: {exc}"
        else:
            decision, why = _read(answer, link.report_url)
            if decision is not None and not delivered:
                delivered = True
                log.info(
                    "group_report_sent",
                    leader=link.report_url,
                    node_rank=report.node_rank,
                    fits=report.fits,
                    hicache_size_gb=report.hicache_size_gb,
                    summary=report.summary,
                )
            if decision is not None and decision.state is not DecisionState.WAITING:
                return decision
        if clock.monotonic() - started >= timeout_s:
            raise GroupMustRecreate(
                f"the group must be recreated: no launch decision from the leader within "
                f"{format_duration(timeout_s)} ([group] report_timeout): {why}"
            )
        clock.sleep(every_s)


def report_payload(report: NodeReport, group_size: int) -> dict[str, object]:
    """The JSON a worker POSTs (core/group_report.py's wire format)."""
    return {"version": REPORT_VERSION, "nnodes": group_size, **report.to_json()}


def _read(answer: Answer, url: str) -> tuple[GroupDecision | None, str]:
    """The leader's decision (None when it gave none) and why there is none yet.

    Raises:
        ConfigError: 401 or 400 (asking again cannot help).
        GroupMustRecreate: 409.
    """
    text = answer.body.decode("utf-8", "replace").strip()[:500]
    if answer.status == 401:
        raise ConfigError(
            f"the leader's supervisor at {url} refuses this node's group token (401): every "
            "node needs the same SGLANG_SUPERVISOR_GROUP_TOKEN (or [group] token)"
        )
    if answer.status == 400:
        raise ConfigError(f"the leader's supervisor at {url} refuses this node's report: {text}")
    if answer.status == 409:
        raise GroupMustRecreate(f"the group must be recreated: the leader says {text}")
    if answer.status != 200:
        return None, f"the leader's supervisor at {url} answers HTTP {answer.status}: {text}"
    try:
        decision = parse_decision(answer.body)
    except ReportError as exc:
        return None, f"the answer of {url} is not a decision: {exc}"
    return decision, decision.reason or "the leader is waiting"
