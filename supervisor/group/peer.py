"""A worker node's watch of its leader: beside each launch, ask the leader's supervisor
`/healthz` every `[run] health_interval`; after `[run] failure_threshold` misses in a row
(core/group_peer.py says what a miss is) kill the local tree and tell the run loop, which
files the death `peer_lost` and exits 8 like any death in group mode.

Without it a worker outlives its leader forever where nobody recreates the group (systemd, or
the LWS harness's observe mode): SGLang's worker `/health` is a dummy 200
(sglang/srt/entrypoints/http_server.py, the `node_rank >= 1` path) and its ranks wait in NCCL
collectives without exiting, so the worker's own rank and health checks see nothing wrong.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import structlog

from supervisor.adapters.background import Background
from supervisor.adapters.group_http import Answer, Unreachable
from supervisor.core.classify import FailureKind
from supervisor.core.events import Event, KillReason, MemoryAction, WatchdogEvent
from supervisor.core.group_peer import LeaderSeen, after_answer, leader_lost
from supervisor.core.ports import Clock, ServerHandle

log = structlog.get_logger("supervisor.group")

HEALTHZ_PATH = "/healthz"

# (url, timeout_s) -> the answer; raises Unreachable (adapters/group_http.get).
HealthGet = Callable[[str, float], Answer]


@runtime_checkable
class _Recorded(Protocol):
    """A tree that records why it is being stopped (adapters/server_process.py)."""

    @property
    def kill_reason(self) -> KillReason | None: ...


@dataclass(frozen=True, slots=True)
class WatchTiming:
    """`[run] health_interval`, `health_timeout` and `failure_threshold`, as for SGLang's own
    health: the leader is lost on the evidence that would declare a local server dead."""

    interval_s: float
    timeout_s: float
    threshold: int


class LeaderWatch(Background):
    """The component of one worker launch: a thread that asks the leader once at the start,
    then every interval, and acts once. It logs from its own thread, where the runner's bound
    run_id and server_pid are not visible: they are passed in."""

    thread_name = "group-leader"

    def __init__(
        self,
        url: str,
        server: ServerHandle,
        post: Callable[[Event], None],
        *,
        get: HealthGet,
        timing: WatchTiming,
        clock: Clock,
        run_id: str,
    ) -> None:
        self.url = url
        self.server = server
        self.post = post
        self.get = get
        self.timing = timing
        self.clock = clock
        self.ids = {"run_id": run_id, "server_pid": server.pid}
        self.seen = LeaderSeen()
        self.lost = threading.Event()
        super().__init__()

    def ask_once(self) -> bool:
        """One question to the leader; True once the leader is lost (the tree was killed and
        the death posted, or someone else is already ending it): nothing more to ask."""
        try:
            answer = self.get(self.url, self.timing.timeout_s)
        except Unreachable as exc:
            self.seen = after_answer(self.seen, None, b"", str(exc))
        else:
            self.seen = after_answer(self.seen, answer.status, answer.body)
        if not leader_lost(self.seen, self.timing.threshold):
            return False
        self._act(self.seen)
        return True

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.ask_once():
            self._stop.wait(self.timing.interval_s)

    def _act(self, seen: LeaderSeen) -> None:
        """Kill the tree and post the death, unless the tree is already being stopped or
        killed for another reason (a stop drains it: the leader going first is no failure)."""
        if self._stop.is_set() or self._already_ending():
            return
        self.lost.set()
        log.error(
            "group_leader_lost",
            url=self.url,
            misses=seen.misses,
            last_answer=seen.last_answer,
            detail="the leader's ranks are gone or hang: this node's ranks cannot go on",
            **self.ids,
        )
        reason = (
            f"the leader's supervisor at {self.url} failed {seen.misses} checks in a row "
            f"(last: {seen.last_answer})"
        )
        kind = FailureKind.PEER_LOST
        pids = self.server.kill_all(KillReason(kind, reason))
        self.post(
            WatchdogEvent(
                action=MemoryAction.KILLED,
                failure=kind,
                reason=reason,
                at_s=self.clock.monotonic(),
                pids=pids,
            )
        )

    def _already_ending(self) -> bool:
        server = self.server
        return isinstance(server, _Recorded) and server.kill_reason is not None
