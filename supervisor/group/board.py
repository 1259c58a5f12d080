"""The leader's board: every node's pre-flight report and the group's one launch decision, with
the two endpoints workers and operators reach on the leader's listener.

    POST /group/report   a worker's NodeReport (Bearer token) -> the decision so far (JSON)
    GET  /group/status   the reports and the decision (Bearer token), for operators

Requests arrive on the listener's threads while the run loop waits on the board: every read and
write holds one lock. Once the decision is launch or refused it never changes, and every later
POST gets it (a worker re-POSTs until it sees it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import structlog

from supervisor.adapters.http_server import HttpListener, Request, Response
from supervisor.core.group_report import (
    DecisionState,
    GroupDecision,
    NodeReport,
    ReportError,
    decide_group,
    missing_nodes,
    parse_report,
    token_matches,
)

log = structlog.get_logger("supervisor.group")

MAX_REPORT_BYTES = 64 * 1024
REPORT_PATH = "/group/report"
STATUS_PATH = "/group/status"


class GroupBoard:
    """What the leader knows of its group; thread-safe."""

    def __init__(self, size: int, token: str) -> None:
        self.size = size
        self._token = token
        self._lock = threading.Lock()
        self._reports: dict[int, NodeReport] = {}
        self._final: GroupDecision | None = None  # launch or refused: fixed from then on
        self._told: set[int] = set()  # workers that were answered with the final decision

    # -- the run loop's side -----------------------------------------------------------------

    def record_own(self, report: NodeReport) -> GroupDecision:
        """The leader's own report (node 0); the decision it leads to."""
        with self._lock:
            self._reports[report.node_rank] = report
            return self._decide()

    def decision(self) -> GroupDecision:
        with self._lock:
            return self._decide()

    def missing(self) -> tuple[int, ...]:
        with self._lock:
            return missing_nodes(self.size, self._reports)

    def all_told(self) -> bool:
        """Every worker has been answered with the final decision."""
        with self._lock:
            return self._told >= set(range(1, self.size))

    def snapshot(self) -> dict[str, Any]:
        """The reports so far and the decision, as GET /group/status shows them."""
        with self._lock:
            decision = self._decide()
            return {
                "size": self.size,
                "reports": {str(r): rep.to_json() for r, rep in sorted(self._reports.items())},
                "missing": list(missing_nodes(self.size, self._reports)),
                "decision": decision.to_json(),
            }

    def _decide(self) -> GroupDecision:
        """Under the lock."""
        if self._final is not None:
            return self._final
        decision = decide_group(self.size, self._reports)
        if decision.state is not DecisionState.WAITING:
            self._final = decision
        return decision

    # -- the endpoints -----------------------------------------------------------------------

    def serve_on(self, listener: HttpListener) -> None:
        listener.route(REPORT_PATH, self.handle_report, methods=("POST",))
        listener.route(STATUS_PATH, self.handle_status)

    def handle_report(self, request: Request) -> Response:
        if not self._authorized(request):
            return _text(401, "missing or wrong group token (Authorization: Bearer <token>)")
        if len(request.body) > MAX_REPORT_BYTES:
            return _text(413, f"a report is at most {MAX_REPORT_BYTES} bytes")
        try:
            report = parse_report(request.body, group_size=self.size)
        except ReportError as exc:
            return _text(400, str(exc))
        with self._lock:
            earlier = self._reports.get(report.node_rank)
            if earlier is not None and earlier.host != report.host:
                return _text(
                    409,
                    f"node {report.node_rank} already reported from {earlier.host}, not "
                    f"{report.host}: two pods claim the same node rank",
                )
            self._reports[report.node_rank] = report
            decision = self._decide()
            if decision.state is not DecisionState.WAITING:
                self._told.add(report.node_rank)
        if earlier != report:  # a re-POST of the same report is not news
            log.info(
                "group_report_received",
                node_rank=report.node_rank,
                host=report.host,
                fits=report.fits,
                hicache_size_gb=report.hicache_size_gb,
                summary=report.summary,
            )
        return _json(200, decision.to_json())

    def handle_status(self, request: Request) -> Response:
        if not self._authorized(request):
            return _text(401, "missing or wrong group token (Authorization: Bearer <token>)")
        return _json(200, self.snapshot())

    def _authorized(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # Compared even for a wrong scheme: the time taken says nothing about the token.
        matches = token_matches(given.strip(), self._token)
        return matches and scheme.lower() == "bearer"


def _text(status: int, message: str) -> Response:
    return Response(status, message.encode("utf-8") + b"\n")


def _json(status: int, body: Mapping[str, object]) -> Response:
    return Response(status, json.dumps(body).encode("utf-8") + b"\n", "application/json")
