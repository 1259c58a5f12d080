"""The group's one launch decision, agreed before anything is launched on any node.

Every node runs its own pre-flight (its own restart-smaller override, auto-size) and makes a
NodeReport of it. A worker POSTs it to the leader and polls (client.py); the leader records its
own, waits for every worker's (board.py), decides (core/group_report.py), and answers every POST
with the decision from then on. On launch each node applies the group's --hicache-size (the
smallest any node can afford: smaller needs less host memory, so each node's verdict holds). On a
refusal every node exits 1 before a single GPU byte is allocated, the leader's log naming the
refusing nodes and their numbers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import structlog

from supervisor.adapters.group_http import Unreachable
from supervisor.core.checks import FitReport, Status
from supervisor.core.group import GroupSpec
from supervisor.core.group_report import (
    MAX_TEXT_CHARS,
    DecisionState,
    GroupDecision,
    NodeReport,
    launch_hicache_gb,
)
from supervisor.core.ports import Clock
from supervisor.core.sglang_args import LaunchPlan, redact_argv, with_flag_value
from supervisor.core.units import format_gb
from supervisor.errors import GroupMustRecreate, PreflightFailed
from supervisor.group.board import GroupBoard
from supervisor.group.client import LeaderLink, await_decision, report_payload
from supervisor.group.resolve import format_duration

log = structlog.get_logger("supervisor.group")

POLL_S = 0.2  # the leader looks at its board this often while it waits
WAITING_EVERY_S = 30.0  # `group_waiting` at most this often
# After a refusal the leader keeps answering until every worker has seen it, at most this long.
LINGER_S = 30.0


def node_host() -> str:
    """This node's name as the others see it in messages (a pod's name in Kubernetes)."""
    return os.uname().nodename


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupHandshake:
    """One node's part in the decision: the leader's board, or a worker's link to it."""

    spec: GroupSpec
    report_timeout_s: float
    host: str
    board: GroupBoard | None = None  # node 0
    link: LeaderLink | None = None  # nodes 1..size-1
    linger_s: float = LINGER_S

    def agree(
        self, argv: Sequence[str], fit: FitReport | None, plan: LaunchPlan, clock: Clock
    ) -> tuple[str, ...]:
        """The argv to launch with, once the group decided to launch.

        Raises:
            PreflightFailed: the group refused (the reason names every refusing node).
            GroupMustRecreate: a node never reported (leader), or no decision came (worker).
            ConfigError: the leader refuses this node's token or report (worker).
            StopRequested: a stop signal during a wait.
        """
        report = node_report(self.spec.node_rank, self.host, fit, plan, fits=True)
        decision = self._decide(report, clock)
        if decision.state is DecisionState.REFUSED:
            self._refused(decision, clock)
            raise PreflightFailed(decision.reason)
        return group_argv(argv, plan, decision)

    def refused_here(self, refusal: PreflightFailed, plan: LaunchPlan, clock: Clock) -> None:
        """This node's own pre-flight refused: tell the group, so the leader refuses it whole
        and names this node; the caller then ends the run with `refusal` (exit 1)."""
        fit = refusal.fit if isinstance(refusal.fit, FitReport) else None
        report = node_report(self.spec.node_rank, self.host, fit, plan, fits=False)
        if self.board is not None:
            decision = self.board.record_own(report)
            _said(decision)
            self._refused(decision, clock)
            return
        assert self.link is not None
        try:  # once: the worker exits now, the leader learns the rest from the recreation
            answer = self.link.post(
                self.link.report_url, report_payload(report, self.spec.size), self.link.token
            )
        except Unreachable as exc:
            log.warning("group_report_not_sent", leader=self.link.report_url, error=str(exc))
            return
        log.info(
            "group_report_sent",
            leader=self.link.report_url,
            node_rank=report.node_rank,
            fits=False,
            status=answer.status,
            summary=report.summary,
        )

    def _decide(self, report: NodeReport, clock: Clock) -> GroupDecision:
        if self.board is not None:
            decision = self._lead(self.board, report, clock)
        else:
            assert self.link is not None
            decision = await_decision(
                self.link,
                report,
                group_size=self.spec.size,
                clock=clock,
                timeout_s=self.report_timeout_s,
            )
        _said(decision)
        return decision

    def _lead(self, board: GroupBoard, report: NodeReport, clock: Clock) -> GroupDecision:
        """Record the leader's report, then wait until every worker's came (or one refused)."""
        started = clock.monotonic()
        said_at = float("-inf")
        decision = board.record_own(report)
        while decision.state is DecisionState.WAITING:
            waited = clock.monotonic() - started
            missing = ", ".join(str(rank) for rank in board.missing())
            if waited >= self.report_timeout_s:
                raise GroupMustRecreate(
                    f"the group must be recreated: node {missing} did not report within "
                    f"{format_duration(self.report_timeout_s)} ([group] report_timeout)"
                )
            if waited - said_at >= WAITING_EVERY_S:
                said_at = waited
                log.info("group_waiting", missing_nodes=missing, waited_s=round(waited))
            clock.sleep(POLL_S)
            decision = board.decision()
        return decision

    def _refused(self, decision: GroupDecision, clock: Clock) -> None:
        """On the leader: say who refused, and keep answering until every worker knows."""
        if self.board is None:
            return
        log.error(
            "group_refused", reason=decision.reason, refused_nodes=list(decision.refused_nodes)
        )
        deadline = clock.monotonic() + self.linger_s
        while not self.board.all_told() and clock.monotonic() < deadline:
            clock.sleep(POLL_S)


def _said(decision: GroupDecision) -> None:
    log.info(
        "group_decision",
        state=decision.state.value,
        hicache_size_gb=decision.hicache_size_gb,
        reason=decision.reason,
        refused_nodes=list(decision.refused_nodes),
    )


def group_argv(argv: Sequence[str], plan: LaunchPlan, decision: GroupDecision) -> tuple[str, ...]:
    """`argv` with the group's --hicache-size where this node's fixed size is larger."""
    own = own_hicache_gb(plan)
    size = launch_hicache_gb(own, decision)
    if size is None:
        return tuple(argv)
    sized = with_flag_value(argv, "--hicache-size", str(size))
    log.warning(
        "group_hicache_applied",
        hicache_size_gb=size,
        own_gb=own,
        argv=list(redact_argv(sized)),
    )
    return sized


def own_hicache_gb(plan: LaunchPlan) -> int | None:
    """The fixed --hicache-size this node launches with; None without HiCache or a fixed size."""
    if not plan.uses_hicache or plan.hicache_size_gb <= 0:
        return None
    return plan.hicache_size_gb


def node_report(
    rank: int, host: str, fit: FitReport | None, plan: LaunchPlan, *, fits: bool
) -> NodeReport:
    """This node's report of its pre-flight (`fit` None: skipped with --force)."""
    failed = tuple(c.name for c in fit.checks if c.status is Status.FAIL) if fit else ()
    return NodeReport(
        node_rank=rank,
        host=host[:MAX_TEXT_CHARS],
        fits=fits,
        hicache_size_gb=own_hicache_gb(plan),
        host_required_bytes=fit.host_required_bytes if fit else None,
        host_budget_bytes=fit.host_budget_bytes if fit else None,
        failed_checks=failed,
        summary=summary_line(fit),
    )


def summary_line(fit: FitReport | None) -> str:
    """One line of arithmetic for the leader's log: what the host needs and has, what failed."""
    if fit is None:
        return "pre-flight skipped (--force)"
    parts = []
    if fit.host_required_bytes is not None:
        need = f"host memory: needs {format_gb(fit.host_required_bytes)} of "
        need += format_gb(fit.host_budget_bytes)
        if fit.host_pool_bytes_per_rank:
            pool = format_gb(fit.host_pool_bytes_per_rank)
            need += f" ({fit.local_ranks} ranks × {pool} HiCache + the rest)"
        parts.append(need)
    parts += [f"{c.name}: {c.detail}" for c in fit.checks if c.status is Status.FAIL]
    # One line from another node goes into the leader's log: no control characters.
    line = "".join(ch for ch in " ".join("; ".join(parts).split()) if ch.isprintable())
    line = line or "fits"
    return line[:MAX_TEXT_CHARS]
