"""Shared pieces of the group tests: a spec, reports, and a leader's board served on a real
loopback listener (the same route table `run` serves)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from supervisor.adapters import group_http
from supervisor.adapters.http_server import HttpListener
from supervisor.core.group import GroupMode, GroupSpec
from supervisor.core.group_report import NodeReport
from supervisor.group.board import GroupBoard
from supervisor.group.client import LeaderLink

TOKEN = "s3cret-group-token"


def spec(size: int = 2, rank: int = 0, *, gate_port: int = 30100) -> GroupSpec:
    return GroupSpec(GroupMode.LWS, size, rank, "127.0.0.1", 20000, gate_port)


def report(rank: int, *, fits: bool = True, size_gb: int | None = 40, host: str = "") -> NodeReport:
    return NodeReport(
        node_rank=rank,
        host=host or f"node-{rank}",
        fits=fits,
        hicache_size_gb=size_gb,
        host_required_bytes=400_000_000_000 if fits else 500_000_000_000,
        host_budget_bytes=440_000_000_000,
        failed_checks=() if fits else ("host_memory",),
        summary="host memory: needs 400.0 GB of 440.0 GB" if fits else "needs 500.0 GB of 440.0 GB",
    )


def wire(rep: NodeReport, size: int = 2, **changes: object) -> dict[str, object]:
    return {"version": 1, "nnodes": size, **rep.to_json(), **changes}


@dataclasses.dataclass
class Leader:
    board: GroupBoard
    port: int

    @property
    def report_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/group/report"

    def link(self, token: str = TOKEN) -> LeaderLink:
        return LeaderLink(self.report_url, token, post_json)

    def post(self, body: object, *, auth: str | None = f"Bearer {TOKEN}") -> requests.Response:
        headers = {"Authorization": auth} if auth is not None else {}
        if isinstance(body, bytes):
            return requests.post(self.report_url, data=body, headers=headers, timeout=10)
        return requests.post(self.report_url, json=body, headers=headers, timeout=10)


def post_json(url: str, payload: object, token: str) -> group_http.Answer:
    assert isinstance(payload, dict)
    return group_http.post_json(url, payload, token=token)


@contextmanager
def listening(port: int = 0) -> Iterator[HttpListener]:
    """A loopback listener for the block."""
    listener = HttpListener("127.0.0.1", port)
    listener.start()
    try:
        yield listener
    finally:
        listener.close()


def leader_on(listener: HttpListener, board: GroupBoard) -> Leader:
    """`board`'s endpoints on `listener` (routes can be replaced while it serves)."""
    board.serve_on(listener)
    return Leader(board, listener.port)
