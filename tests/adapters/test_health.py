"""The HTTP health probe against a real loopback server: refused, 503, 200, timeout."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from supervisor.adapters.health import HttpHealthProbe, health_url
from supervisor.core.lifecycle import HealthStatus


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    block: threading.Event | None = None

    def do_GET(self) -> None:
        if self.block is not None:
            self.block.wait(5)
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    _Handler.status = 200
    _Handler.block = None
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def _url(httpd: http.server.ThreadingHTTPServer) -> str:
    return health_url("127.0.0.1", httpd.server_address[1], "/health")


@pytest.mark.parametrize(
    ("status", "expected"),
    [(200, HealthStatus.READY), (503, HealthStatus.WARMING), (500, HealthStatus.ERROR)],
)
def test_status_codes(server, status, expected):
    _Handler.status = status
    assert HttpHealthProbe(_url(server), timeout_s=5).check() is expected


def test_nothing_listening_is_refused(free_port):
    url = health_url("0.0.0.0", free_port, "/health")
    assert url == f"http://127.0.0.1:{free_port}/health"
    assert HttpHealthProbe(url, timeout_s=5).check() is HealthStatus.REFUSED


def test_no_answer_within_the_timeout_is_a_timeout(server):
    _Handler.block = threading.Event()
    try:
        assert HttpHealthProbe(_url(server), timeout_s=0.2).check() is HealthStatus.TIMEOUT
    finally:
        _Handler.block.set()


def test_ipv6_wildcard_is_probed_on_loopback():
    assert health_url("::", 30000, "/health") == "http://[::1]:30000/health"
