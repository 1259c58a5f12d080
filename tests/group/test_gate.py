"""The leader's gate opener against a small HTTP server that plays SGLang's launch gate
(sglang/srt/distributed/gated_launch.py): `GET /health` answers once rank 0 serves it,
`POST /gate/activate` opens it. The opener knocks once the gate answers, and only once."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

from supervisor.adapters import group_http
from supervisor.adapters.http_server import HttpListener, Request, Response
from supervisor.group.gate import GateHttp, GateOpener
from tests.waiting import wait_until

HTTP = GateHttp(get=group_http.get, post=group_http.post_empty)


class Gate:
    """SGLang's gate server: 503 from /health until `serving`, then 200 "OK"."""

    def __init__(self) -> None:
        self.serving = threading.Event()
        self.health_checks = 0
        self.activations = 0

    def health(self, _request: Request) -> Response:
        self.health_checks += 1
        return Response(200, b"OK") if self.serving.is_set() else Response(503, b"")

    def activate(self, _request: Request) -> Response:
        self.activations += 1
        return Response(200, b"OK")


@pytest.fixture
def gate():
    gate = Gate()
    listener = HttpListener("127.0.0.1", 0)
    listener.route("/health", gate.health)
    listener.route("/gate/activate", gate.activate, methods=("POST",))
    listener.start()
    yield gate, listener.port
    listener.close()


def test_the_gate_is_opened_once_it_answers(gate):
    server, port = gate
    opener = GateOpener("0.0.0.0", port, HTTP, run_id="r1", server_pid=42)  # reached on loopback
    with capture_logs() as logs:
        opener.start()
        wait_until(lambda: server.health_checks >= 2, what="the opener to ask twice")
        assert server.activations == 0  # not before the gate serves
        server.serving.set()
        wait_until(opener.opened.is_set, what="the gate to be opened")
        opener.stop()
    assert server.activations == 1
    opened = [e for e in logs if e["event"] == "group_gate_opened"]
    assert len(opened) == 1
    assert (opened[0]["run_id"], opened[0]["server_pid"]) == ("r1", 42)
    assert opened[0]["url"] == f"http://127.0.0.1:{port}/gate/activate"


def test_a_gate_that_never_serves_is_left_alone_when_the_launch_ends(gate):
    server, port = gate
    opener = GateOpener("127.0.0.1", port, HTTP, run_id="r1", server_pid=42)
    opener.start()
    wait_until(lambda: server.health_checks >= 1, what="the opener to ask")
    opener.stop()
    assert not opener.opened.is_set()
    assert server.activations == 0


def test_nothing_listening_yet_is_not_an_error():
    opener = GateOpener("127.0.0.1", 9, HTTP, run_id="r1", server_pid=42)  # discard: refused
    assert opener._knock() is False
