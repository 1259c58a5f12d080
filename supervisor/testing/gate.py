"""SGLang's gated launch (--gated-launch-port), as each simulated rank plays it.

Written from sglang/srt/distributed/gated_launch.py `maybe_wait_for_gated_launch`, called by
distributed/bootstrap.py `measure_pre_model_load_memory`: after the distributed environment is
up and before the weights load, world rank 0 starts the control server on (--host, port) (a
uvicorn thread: GET /health -> "OK", POST /gate/activate -> "OK"; it is never stopped) and logs
"Gated launch control server started on H:P"; every rank logs "Gated launch waiting for
activation. rank=N", then broadcasts rank 0's flag every POLL_INTERVAL_S (logging "Gated launch
still waiting for activation. rank=N elapsed=X s" every LOG_INTERVAL_S) until it reads 1, and
logs "Gated launch activated. elapsed=X.XX s". The simulated broadcast is the communicator's
(rendezvous.py): rank 0 reads its flag each poll and relays it; the others learn it from there.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from supervisor.testing.ranks import log, log_uvicorn
from supervisor.testing.rendezvous import Communicator

POLL_INTERVAL_S = 1.0
LOG_INTERVAL_S = 10.0
_TICK_S = 0.02


class _Flag:
    def __init__(self) -> None:
        self.activated = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    flag: _Flag
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # log_level="warning": uvicorn's access lines are off

    def _send(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        ctype = "text/plain; charset=utf-8" if status == 200 else "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/health":
            self._send(200, "OK")
        elif self.path.split("?", 1)[0] == "/gate/activate":
            self._send(405, '{"detail":"Method Not Allowed"}')
        else:
            self._send(404, '{"detail":"Not Found"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.split("?", 1)[0] == "/gate/activate":
            self.flag.activated.set()
            self._send(200, "OK")
        elif self.path.split("?", 1)[0] == "/health":
            self._send(405, '{"detail":"Method Not Allowed"}')
        else:
            self._send(404, '{"detail":"Not Found"}')


def _serve(host: str, port: int, prefix: str) -> _Flag:
    """_GatedLaunchServer.serve: the line is logged whether or not uvicorn manages to bind."""
    flag = _Flag()
    handler = type("GateHandler", (_Handler,), {"flag": flag})
    server_class = type(
        "GateServer",
        (ThreadingHTTPServer,),
        {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET},
    )
    try:
        server = server_class((host, port), handler)
    except OSError as exc:  # uvicorn's thread logs the bind error and ends; the gate stays shut
        log(prefix, f"Gated launch control server started on {host}:{port}")
        reason = exc.strerror.lower() if exc.strerror else str(exc)
        log_uvicorn(
            "ERROR",
            f"[Errno {exc.errno}] error while attempting to bind on address "
            f"('{host}', {port}): {reason}",
        )
        return flag
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="gate", daemon=True
    ).start()
    log(prefix, f"Gated launch control server started on {host}:{port}")
    return flag


def wait_for_gate(comm: Communicator, prefix: str, wait: Callable[[float], None]) -> None:
    """Block this rank until the gate opens; `wait(seconds)` keeps it answering its parent."""
    world = comm.world
    if world.gate_port is None:
        return
    flag = _serve(world.gate_host, world.gate_port, prefix) if world.rank == 0 else None
    log(prefix, f"Gated launch waiting for activation. rank={world.rank}")
    began = time.perf_counter()
    next_log_at = began + LOG_INTERVAL_S
    while True:
        if flag is not None and flag.activated.is_set():
            comm.broadcast("activate")
        if comm.activated.is_set():
            break
        if (now := time.perf_counter()) >= next_log_at:
            log(
                prefix,
                "Gated launch still waiting for activation. "
                f"rank={world.rank} elapsed={now - began:.0f} s",
            )
            next_log_at = now + LOG_INTERVAL_S
        # Rank 0 polls its flag once a second; the others hear its broadcast as it comes.
        wait(POLL_INTERVAL_S if flag is not None else _TICK_S)
    log(prefix, f"Gated launch activated. elapsed={time.perf_counter() - began:.2f} s")
