"""The leader opens SGLang's launch gate once the group decided to launch.

With `--gated-launch-port P` every rank of every node stops after distributed init, before its
large GPU allocations; world rank 0 serves `GET /health` and `POST /gate/activate` on (--host,
P), and the activation is broadcast to every rank (sglang/srt/distributed/gated_launch.py). The
leader's supervisor, having agreed the launch with every node before anything was launched,
knocks as soon as the gate answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from supervisor.adapters.background import Background
from supervisor.adapters.group_http import Answer, Unreachable, url
from supervisor.core.listen import probe_host

log = structlog.get_logger("supervisor.group")

POLL_EVERY_S = 0.5


@dataclass(frozen=True, slots=True)
class GateHttp:
    """How the gate is reached (adapters/group_http.py in production)."""

    get: Callable[[str], Answer]
    post: Callable[[str], Answer]


class GateOpener(Background):
    """A component beside the leader's launch: polls the gate's /health every 0.5 s until it
    answers 200, then activates it, once. It logs from its own thread, where the runner's
    bound run_id and server_pid are not visible: they are passed in."""

    thread_name = "group-gate"

    def __init__(
        self, host: str, port: int, http: GateHttp, *, run_id: str, server_pid: int
    ) -> None:
        target = probe_host(host)  # SGLang's --host: a wildcard is reached over loopback
        self.health_url = url(target, port, "/health")
        self.activate_url = url(target, port, "/gate/activate")
        self.http = http
        self.ids = {"run_id": run_id, "server_pid": server_pid}
        self.opened = threading.Event()
        super().__init__()

    def _loop(self) -> None:
        waited = 0
        while not self._stop.is_set():
            if self._knock():
                self.opened.set()
                log.info(
                    "group_gate_opened",
                    url=self.activate_url,
                    health_checks=waited + 1,
                    **self.ids,
                )
                return
            waited += 1
            self._stop.wait(POLL_EVERY_S)

    def _knock(self) -> bool:
        """True once the gate answered /health with 200 and took the activation."""
        try:
            if self.http.get(self.health_url).status != 200:
                return False
            return self.http.post(self.activate_url).status == 200
        except Unreachable:  # not serving yet: the ranks are still in distributed init
            return False
