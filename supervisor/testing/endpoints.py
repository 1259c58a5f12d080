"""The simulated server's HTTP side: SGLang's endpoints over stdlib http.server.

Imitated (paths under sglang/srt/): entrypoints/http_server.py `health_generate` (/health and
/health_generate: 503 while shutting down, with "Health check request received during shutdown.
Returning 503.", 503 while Starting, otherwise a 1-token generation every rank must answer,
looked at only after the handler's `asyncio.sleep(1)` and each second after it, so a 200 takes
at least 1 s, and rank 0 logs its "Prefill batch" line (managers/scheduler_metrics_mixin.py
`log_prefill_stats`); a failure logs "Health check failed. …" and marks the server UnHealthy, a
success marks it Up),
`ready` (200 only when Up and not shutting down), the toy /generate (tokenizer_manager.py
`generate_request`: accepted in every state, draining included, counted in `rid_to_state` until
answered; the first one installs the tokenizer manager's signal handlers,
`auto_create_handle_loop`), /model_info, /server_info, /v1/models, /metrics (only with
--enable-metrics). Worker nodes run utils/common.py `launch_dummy_health_check_server`:
/health, /health_generate and /ping always 200, nothing else.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any

from supervisor.testing.args import SimArgs
from supervisor.testing.ranks import log
from supervisor.testing.scenario import Scenario

STARTING = "Starting"  # tokenizer_manager.py ServerStatus
UP = "Up"
UNHEALTHY = "UnHealthy"
# How often a request in progress looks whether the server froze meanwhile.
_TICK_S = 0.01
# The scheduler's line for the health check's one-token prefill (log_prefill_stats, 0.5.23).
PREFILL_LINE = (
    "Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, "
    "#running-req: 0, #queue-req: 0, "
)


class RankLink:
    """The parent's end of one child's pipe, shared by HTTP threads."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def send(self, message: object) -> None:
        # A child that is gone is noticed by whoever watches it.
        with self._lock, contextlib.suppress(OSError):
            self.conn.send(message)

    def ping(self, timeout_s: float) -> bool:
        """True when the child answers within `timeout_s` (a stopped or dead one does not)."""
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            seq = next(self._seq)
            self.conn.send(("ping", seq))
            while (left := deadline - time.monotonic()) > 0:
                if not self.conn.poll(left):
                    return False
                if self.conn.recv() == ("pong", seq):
                    return True
            return False
        except (OSError, EOFError):
            return False
        finally:
            self._lock.release()


class ServerView:
    """What the HTTP threads see of the server, and what they change in it."""

    def __init__(
        self, plan: SimArgs, scenario: Scenario, info: dict[str, Any], ranks: list[RankLink]
    ) -> None:
        self.plan = plan
        self.scenario = scenario
        self.info = info
        self.ranks = ranks
        self.status = STARTING
        self.gracefully_exit = False
        self.frozen = False  # the event loop is blocked (crash dump, final waits): no answers
        self.on_first_generate: Callable[[], None] = lambda: None
        self.prefill_prefix = ""  # rank 0's log prefix: its scheduler logs the prefill
        self._lock = threading.Lock()
        self._up_at: float | None = None
        self._requests: dict[str, float] = {}  # rid_to_state
        self._last_receive = time.time()
        self.never = threading.Event()  # waited on to "freeze" a request; never set

    def set_up(self) -> None:
        with self._lock:
            self.status = UP
            self._up_at = time.monotonic()

    def remaining_rids(self) -> list[str]:
        with self._lock:
            return list(self._requests)

    def generate(self) -> bool:
        """One request, in flight for request_s; answered even while draining.

        False when the server froze meanwhile (the answer never comes)."""
        self.on_first_generate()
        rid = uuid.uuid4().hex
        with self._lock:
            self._requests[rid] = time.monotonic()
        deadline = time.monotonic() + self.scenario.request_s
        while time.monotonic() < deadline:
            time.sleep(_TICK_S)
        if self.frozen:
            return False  # in flight for good: the crash path kills the process
        with self._lock:
            self._requests.pop(rid, None)
        return True

    def health_failing(self) -> bool:
        after_s = self.scenario.health_fail_after_s
        with self._lock:
            up_at = self._up_at
        return after_s is not None and up_at is not None and time.monotonic() - up_at >= after_s

    def health_status(self) -> int | None:
        """HTTP status for /health now; None means "no answer" (the request hangs)."""
        if self.plan.node_rank >= 1:
            return 200  # the dummy health server
        if self.gracefully_exit:
            log("", "Health check request received during shutdown. Returning 503.")
            return 503
        if self.status == STARTING:
            return 503
        self.on_first_generate()
        tic = time.time()
        if self.health_failing():
            if self.scenario.health_fail_mode != "503":
                return None
            return self._health_failed(tic)
        timeout_s = self.scenario.health_check_timeout_s
        looked_s = time.monotonic()
        if all(link.ping(timeout_s) for link in self.ranks):
            log(self.prefill_prefix, PREFILL_LINE)
            self._first_look_after(looked_s)
            with self._lock:
                self._last_receive = time.time()
                self.status = UP
            return 200
        return self._health_failed(tic)

    def _first_look_after(self, started_s: float) -> None:
        """Wait for the handler's first look that follows the answer: it sleeps
        health_delay_s, then looks, and sleeps again while nothing came back."""
        delay_s = self.scenario.health_delay_s
        if delay_s <= 0:
            return
        looks = max(1, math.ceil((time.monotonic() - started_s) / delay_s))
        time.sleep(max(0.0, started_s + looks * delay_s - time.monotonic()))

    def _health_failed(self, tic: float) -> int:
        with self._lock:
            last = self._last_receive
            self.status = UNHEALTHY
        log(
            "",
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"{self.scenario.health_check_timeout_s:g} seconds. tic start time: "
            f"{time.strftime('%H:%M:%S', time.localtime(tic))}. last_heartbeat time: "
            f"{time.strftime('%H:%M:%S', time.localtime(last))}",
        )
        return 503

    def ready(self) -> bool:
        return not self.gracefully_exit and self.status == UP


def _metrics(view: ServerView) -> str:
    labels = f'model_name="{view.info["served_model_name"]}",tp_rank="0",pp_rank="0",dp_rank="0"'
    pool_tokens = view.info["hicache_host_total_tokens"]
    values = {
        "num_running_reqs": len(view.remaining_rids()),
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
        if view.frozen:
            self._freeze()
            return
        if path in ("/health", "/health_generate"):
            status = view.health_status()
            if status is None:
                self._freeze()
                return
            self._send(status)
        elif path == "/ping" and view.plan.node_rank >= 1:
            self._send(200)
        elif path == "/metrics" and view.plan.enable_metrics:
            self._send(200, _metrics(view), "text/plain; version=0.0.4")
        elif view.plan.node_rank >= 1 or path == "/metrics":
            self._send(404, {"detail": "Not Found"})
        elif path == "/ready":
            self._send(200 if view.ready() else 503)
        else:
            self._get_info(path)

    def _get_info(self, path: str) -> None:
        names = {
            "/model_info": "model_info",
            "/get_model_info": "model_info",
            "/server_info": "server_info",
            "/get_server_info": "server_info",
            "/v1/models": "models",
        }
        if path not in names:
            self._send(404, {"detail": "Not Found"})
        elif self._authorized():
            self._send(200, self.view.info[names[path]])

    def do_POST(self) -> None:
        view = self.view
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if view.frozen:
            self._freeze()
            return
        if self.path.split("?", 1)[0] != "/generate" or view.plan.node_rank >= 1:
            self._send(404, {"detail": "Not Found"})
        elif self._authorized():
            if not view.generate():
                self._freeze()
                return
            self._send(200, {"text": " simulated output", "meta_info": {"completion_tokens": 2}})


def start_http(host: str, port: int, view: ServerView) -> ThreadingHTTPServer:
    """Bind and serve in a daemon thread (raises OSError when the port is taken)."""
    handler = type("BoundHandler", (Handler,), {"view": view})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    # A short poll so that a shutdown (uvicorn's "Shutting down") stops listening promptly.
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="http", daemon=True
    ).start()
    return server
