"""`GET /healthz` (liveness) and `GET /readyz` (readiness) of this node, folded from the run's log
events through the event tap, like the status file and the metrics: the log is the one record
of what happened, so the probes cannot disagree with it.

Kubernetes points its probes here rather than at SGLang: on `--node-rank` >= 1 SGLang answers a
dummy 200 whatever its ranks do (sglang/srt/entrypoints/http_server.py, the `node_rank >= 1`
launch path), so only the supervisor knows that a local rank died.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from supervisor.adapters.http_server import HttpListener, Request, Response
from supervisor.core.group_peer import SUPERVISOR_ID_KEY

# What the runner's state events say about a node being alive (README "Log events"): a rank
# found dead, health failing, a failed start (`unhealthy`), or a run that ended in a refusal.
_NOT_LIVE_STATES = frozenset({"unhealthy", "fatal"})
_STATE_EVENTS = frozenset(
    {"launching", "loading", "warming", "ready", "unhealthy", "stopping", "stopped", "fatal"}
)
# The GPU event watch kills the tree for these decisions (core/xid.py Verdict.kills).
_GPU_KILLS = frozenset({"restart", "reset", "drain", "reboot"})


class NodeProbes:
    """A log sink (thread-safe, quick, never logs) answering the two probes."""

    def __init__(self, *, group: bool) -> None:
        self._lock = threading.Lock()
        self._state = "starting"  # before the first state event: cleanup, pre-flight
        self._why = ""  # what the last unhealthy or fatal event said
        self._watchdog: str | None = None  # the memory watchdog is killing the tree
        self._gpu: str | None = None  # a GPU is being treated for a driver event
        # One box needs no group decision; a group member is ready only after LAUNCH.
        self._decision: str | None = None if group else "launch"
        self._decision_why = ""
        # Names this supervisor process in every answer: a worker watching its leader's
        # /healthz tells a restarted leader from the one it launched with (core/group_peer.py).
        self.supervisor_id = uuid.uuid4().hex[:12]

    def __call__(self, event: Mapping[str, Any]) -> None:
        name = event.get("event")
        with self._lock:
            if name in _STATE_EVENTS:
                self._on_state(str(name), event)
            elif name == "restarting":
                self._state = "backoff"
            elif name in ("server_killed", "server_terminated"):
                self._watchdog = f"{event.get('cause')}: {event.get('reason')}"
            elif (
                name == "gpu_event" and event.get("target") and event.get("decision") in _GPU_KILLS
            ):
                self._gpu = (
                    f"GPU {event.get('gpu')}: {event.get('meaning')} "
                    f"(decision {event.get('decision')})"
                )
            elif name == "group_decision":
                self._decision = str(event.get("state"))
                self._decision_why = str(event.get("reason") or "")

    def _on_state(self, name: str, event: Mapping[str, Any]) -> None:
        self._state = name
        if name == "launching":  # a new tree: what was treated belongs to the old one
            self._watchdog = self._gpu = None
            self._why = ""
        elif name == "unhealthy":
            self._why = f"{event.get('cause')}: {event.get('detail') or ''}".rstrip(": ")
        elif name == "fatal":
            self._why = str(event.get("reason") or "")

    def live(self) -> tuple[bool, str]:
        """(alive, why not)."""
        with self._lock:
            if self._watchdog is not None:
                return False, f"the memory watchdog is killing the server tree ({self._watchdog})"
            if self._gpu is not None:
                return False, f"a GPU is being treated for a driver event ({self._gpu})"
            if self._state in _NOT_LIVE_STATES:
                return False, f"server {self._state}: {self._why}".rstrip(": ")
            return True, ""

    def ready(self) -> tuple[bool, str]:
        """(ready to serve, why not)."""
        with self._lock:
            state, decision, why = self._state, self._decision, self._decision_why
        if decision == "refused":
            return False, f"the group refused to launch: {why}"
        if decision != "launch":
            return False, "the group has not decided to launch yet"
        if state != "ready":
            return False, f"server {state}"
        alive, why_not = self.live()
        return (True, "") if alive else (False, why_not)

    def healthz(self, _request: Request) -> Response:
        return _answer("live", *self.live(), self.supervisor_id)

    def readyz(self, _request: Request) -> Response:
        return _answer("ready", *self.ready(), self.supervisor_id)

    def serve_on(self, listener: HttpListener) -> None:
        """The probes, answered by the listener's probe threads ahead of everything else."""
        listener.route("/healthz", self.healthz, probe=True)
        listener.route("/readyz", self.readyz, probe=True)


def _answer(key: str, ok: bool, reason: str, supervisor_id: str) -> Response:
    body: dict[str, object] = {key: ok} if ok else {key: False, "reason": reason}
    body[SUPERVISOR_ID_KEY] = supervisor_id
    return Response(200 if ok else 503, json.dumps(body).encode() + b"\n", "application/json")
