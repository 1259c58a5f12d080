"""Failures the real server makes itself: HiCache on CPU (SGLang registers its host pool with
CUDA and fails "Found no NVIDIA driver"), and a foreign HTTP server already on the port that
answers /health 200 (SGLang cannot bind; the supervisor must never call that server ready)."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.real_sglang.lane import LANE_MARKS, Leftovers, free_lane_ports, real_supervisor

pytestmark = LANE_MARKS


def test_hicache_on_cpu_fails_in_sglang_and_the_run_ends_as_a_start_failure(
    tmp_path: Path, simulated_process_guard: str
):
    left: list[Leftovers] = []
    extra = ("--enable-hierarchical-cache", "--hicache-size", "1")
    with real_supervisor(
        tmp_path, simulated_process_guard, extra_args=extra, leftovers=left
    ) as sup:
        rc = sup.wait_exit(timeout_s=900)
        failures = sup.events("server_failed")
        output = sup.output()
    # SGLang's own lines: the pool it sized (1e9 // 512 + one page), then CUDA's refusal.
    assert any("1953126 tokens, 1.00 GB host memory" in line for line in output)
    assert any("Found no NVIDIA driver on your system" in line for line in output)
    # The same start failure twice before ready: exit 4 (the run's documented end).
    assert rc == 4, [(f["failure"], f.get("hint")) for f in failures]
    assert len(failures) == 2
    assert all(not f.get("was_ready", False) for f in failures)
    # SGLang SIGKILLs its own tree after the failure: that is no kernel OOM kill.
    assert [f["failure"] for f in failures] != ["kernel_oom_killed"] * 2, failures
    assert [(x.processes, x.cgroups) for x in left] == [([], [])]


class _AlwaysHealthy(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = json.dumps({"foreign": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, *_args: object) -> None:
        pass


@contextmanager
def foreign_server(port: int) -> Iterator[list[str]]:
    """Someone else's HTTP server on 127.0.0.1:`port`, 200 to everything; yields the paths asked."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _AlwaysHealthy)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield []
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_foreign_server_on_the_port_is_never_reported_ready(
    tmp_path: Path, simulated_process_guard: str
):
    """The pre-flight refuses a port in use (exit 1); `--force` launches anyway, as happens
    when the other server binds between the pre-flight and SGLang."""
    (port,) = free_lane_ports(1)
    left: list[Leftovers] = []
    with (
        foreign_server(port),
        real_supervisor(
            tmp_path,
            simulated_process_guard,
            port=port,
            options=("--max-restarts", "1", "--force"),
            leftovers=left,
        ) as sup,
    ):
        rc = sup.wait_exit(timeout_s=900)
        ready = sup.events("ready")
        failures = sup.events("server_failed")
        foreign = sup.events("foreign_listener")
    # The other server answers /health before SGLang has even imported: the listener check
    # names it at once, before SGLang's own "address already in use" could be reached.
    assert ready == [], ready
    assert foreign, sup.log_text()[-2000:]
    assert foreign[0]["holder_pid"] == os.getpid()  # the foreign server is a thread of ours
    assert failures, sup.log_text()[-2000:]
    assert failures[0]["failure"] == "port_in_use", failures
    assert rc != 0
    assert [(x.processes, x.cgroups) for x in left] == [([], [])]
