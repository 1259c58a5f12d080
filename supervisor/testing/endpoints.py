"""The simulated server's HTTP side: SGLang's endpoints over stdlib http.server.

Serves /health, /health_generate, /ready, /model_info, /server_info, /v1/models, /metrics
(with --enable-metrics) and a toy POST /generate, with SGLang's status codes per phase
(docs/sglang.md §4). /health pings every scheduler over its pipe, as SGLang's 1-token generation
needs every rank to answer.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any

from supervisor.testing.args import SimArgs
from supervisor.testing.scenario import Scenario

PHASE_STARTING = "starting"  # HTTP up, warmup not done: health 503
PHASE_UP = "up"
PHASE_DRAINING = "draining"  # after SIGTERM: health and ready 503
PHASE_CRASHING = "crashing"  # crash path: HTTP frozen, no answers (docs/sglang.md §3.1)


class RankLink:
    """The main process's end of one scheduler's pipe, shared by HTTP threads."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def ping(self, timeout_s: float) -> bool:
        """True when the rank answers within `timeout_s` (a stopped or dead rank does not)."""
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            seq = next(self._seq)
            self.conn.send(("ping", seq))
            while (left := deadline - time.monotonic()) > 0:
                if not self.conn.poll(left):
                    return False
                reply = self.conn.recv()
                if reply == ("pong", seq):
                    return True
            return False
        except (OSError, EOFError):
            return False
        finally:
            self._lock.release()


class ServerView:
    """What the HTTP threads see of the server: phase, static info, links to the ranks."""

    def __init__(
        self, plan: SimArgs, scenario: Scenario, info: dict[str, Any], ranks: list[RankLink]
    ) -> None:
        self.plan = plan
        self.scenario = scenario
        self.info = info
        self.ranks = ranks
        self._phase = PHASE_STARTING
        self._up_at: float | None = None
        self._lock = threading.Lock()
        self.never = threading.Event()  # waited on to "freeze" a request; never set

    @property
    def phase(self) -> str:
        with self._lock:
            return self._phase

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase = phase
            if phase == PHASE_UP:
                self._up_at = time.monotonic()

    def health_failing(self) -> bool:
        after_s = self.scenario.health_fail_after_s
        with self._lock:
            up_at = self._up_at
        return after_s is not None and up_at is not None and time.monotonic() - up_at >= after_s

    def health_status(self) -> int | None:
        """HTTP status for /health now; None means "no answer" (the request hangs)."""
        phase = self.phase
        if phase == PHASE_CRASHING:
            return None
        if phase != PHASE_UP:
            return 503
        if self.plan.node_rank >= 1:
            return 200  # worker nodes run a dummy health server: always 200 (docs/sglang.md §3)
        if self.health_failing():
            return 503 if self.scenario.health_fail_mode == "503" else None
        timeout_s = self.scenario.health_check_timeout_s
        return 200 if all(link.ping(timeout_s) for link in self.ranks) else 503


def _metrics(view: ServerView) -> str:
    labels = f'model_name="{view.info["served_model_name"]}",tp_rank="0",pp_rank="0",dp_rank="0"'
    pool_tokens = view.info["hicache_host_total_tokens"]
    values = {
        "num_running_reqs": 0,
        "num_queue_reqs": 0,
        "num_used_tokens": 0,
        "token_usage": 0.0,
        "max_total_num_tokens": view.info["max_total_num_tokens"],
        "cache_hit_rate": 0.0,
        "gen_throughput": 0.0,
        "hicache_host_used_tokens": 0,
        "hicache_host_total_tokens": pool_tokens,
        "kv_cache_memory_usage_gb": view.info["kv_cache_gb"],
        "num_retracted_reqs": 0,
    }
    lines: list[str] = []
    for name, value in values.items():
        lines += [f"# TYPE sglang:{name} gauge", f"sglang:{name}{{{labels}}} {float(value)}"]
    lines += [
        "# TYPE sglang:num_requests_total counter",
        f"sglang:num_requests_total{{{labels}}} 0.0",
    ]
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    """One request; `view` is set on a subclass per server."""

    view: ServerView
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: health probes every second would drown SGLang's own lines

    def _send(
        self, status: int, body: object = None, content_type: str = "application/json"
    ) -> None:
        data = b""
        if isinstance(body, str):
            data = body.encode()
        elif body is not None:
            data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _freeze(self) -> None:
        self.view.never.wait()

    def _authorized(self) -> bool:
        key = self.view.plan.api_key
        if not key or self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        view = self.view
        path = self.path.split("?", 1)[0]
        if view.phase == PHASE_CRASHING:
            self._freeze()
            return
        if path in ("/health", "/health_generate"):
            status = view.health_status()
            if status is None:
                self._freeze()
                return
            self._send(status)
        elif path == "/ready":
            self._send(200 if view.phase == PHASE_UP else 503)
        elif path == "/metrics":
            if not view.plan.enable_metrics:
                self._send(404, {"detail": "Not Found"})
            else:
                self._send(200, _metrics(view), "text/plain; version=0.0.4")
        elif path in ("/model_info", "/get_model_info"):
            if self._authorized():
                self._send(200, view.info["model_info"])
        elif path in ("/server_info", "/get_server_info"):
            if self._authorized():
                self._send(200, view.info["server_info"])
        elif path == "/v1/models":
            if self._authorized():
                self._send(200, view.info["models"])
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        view = self.view
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if view.phase == PHASE_CRASHING:
            self._freeze()
            return
        if self.path.split("?", 1)[0] != "/generate":
            self._send(404, {"detail": "Not Found"})
        elif self._authorized():
            if view.phase != PHASE_UP:
                self._send(503, {"error": "server is not ready"})
            else:
                self._send(
                    200, {"text": " simulated output", "meta_info": {"completion_tokens": 2}}
                )


def start_http(host: str, port: int, view: ServerView) -> ThreadingHTTPServer:
    """Bind and serve in a daemon thread (raises OSError when the port is taken)."""
    handler = type("BoundHandler", (Handler,), {"view": view})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
