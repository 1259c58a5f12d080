"""The listener under a flood, on loopback: idle and half-sent connections hold no thread, the
probes are answered while every scrape worker is stuck and their queue is full, the threads stay
bounded, and whatever a client sends is answered or dropped, never held."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator

import pytest
import requests

from supervisor.adapters import http_intake, http_server
from supervisor.adapters.http_server import HttpListener, Request, Response
from tests.waiting import wait_until

HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.contextmanager
def serving(release: threading.Event) -> Iterator[tuple[HttpListener, list[str]]]:
    """A listener whose /metrics waits for `release` (a slow scrape), a probe that does not,
    and /echo; yields it and the paths whose handlers have been entered."""
    listener = HttpListener("127.0.0.1", 0)
    entered: list[str] = []

    def slow(request: Request) -> Response:
        entered.append(request.path)
        release.wait(30)
        return Response(200, b"scraped\n")

    listener.route("/metrics", slow)
    listener.route("/healthz", lambda _r: Response(200, b"live\n"), probe=True)
    listener.route("/echo", lambda r: Response(200, r.body), methods=("POST",))
    listener.start()
    try:
        yield listener, entered
    finally:
        release.set()
        listener.close()


@contextlib.contextmanager
def clients(port: int, count: int, send: bytes = b"") -> Iterator[list[socket.socket]]:
    """`count` connections that sent `send` (nothing: idle), all closed at the end."""
    with contextlib.ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=30))
            if send:
                sock.sendall(send)
            socks.append(sock)
        yield socks


def answer(sock: socket.socket) -> bytes:
    """What the server sent until it closed the connection (b"": it closed without a word)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def status(raw: bytes) -> int | None:
    return int(raw.split()[1]) if raw.startswith(b"HTTP/1.1 ") else None


def listener_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("http-")]


def test_a_probe_answers_under_idle_and_half_sent_connections_and_stuck_scrapes():
    release = threading.Event()
    threads_before = threading.active_count()
    with serving(release) as (listener, entered):
        port = listener.port
        idle = clients(port, 200)
        slowloris = clients(port, 100, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        burst = clients(port, 100, HEAD)  # more scrapes than the workers and their queue hold
        with idle, slowloris, burst as scrapes:
            # A kubelet's probe, with a kubelet's patience; it must get its 200.
            probe = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
            assert (probe.status_code, probe.text) == (200, "live\n")
            # No thread per connection: the intake and the two pools, whatever the clients do.
            ours = 1 + http_server.WORKERS + http_server.PROBE_WORKERS
            assert len(listener_threads()) == ours
            assert threading.active_count() <= threads_before + ours
            assert len(entered) <= http_server.WORKERS  # the stuck scrapes hold only those
            release.set()
            statuses = [status(answer(sock)) for sock in scrapes]
    queued = http_server.WORKERS * (1 + http_server.QUEUED_PER_WORKER)
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) >= len(statuses) - queued  # refused at once, not held
    assert statuses.count(200) + statuses.count(503) == len(statuses)


def test_a_connection_that_sends_nothing_is_dropped_after_the_head_timeout(monkeypatch):
    monkeypatch.setattr(http_intake, "HEAD_TIMEOUT_S", 0.2)
    half_sent = b"GET /healthz HTTP/1.1\r\n"
    with (
        serving(threading.Event()) as (listener, _),
        clients(listener.port, 2, half_sent) as (silent, half),
    ):
        assert answer(silent) == b""  # closed by the server, no thread ever held
        assert answer(half) == b""


def test_when_every_slot_is_taken_the_oldest_connection_gives_its_slot_to_a_new_one(
    monkeypatch,
):
    monkeypatch.setattr(http_intake, "MAX_OPEN", 3)
    with (
        serving(threading.Event()) as (listener, _),
        clients(listener.port, 3) as (oldest, *_rest),
    ):
        probe = requests.get(f"http://127.0.0.1:{listener.port}/healthz", timeout=10)
        assert probe.status_code == 200
        assert answer(oldest) == b""


def test_a_full_queue_answers_503_at_once(monkeypatch):
    monkeypatch.setattr(http_server, "WORKERS", 1)
    monkeypatch.setattr(http_server, "QUEUED_PER_WORKER", 1)
    release = threading.Event()
    with serving(release) as (listener, entered), clients(listener.port, 1, HEAD) as (first,):
        # The one worker is stuck in the first scrape: one more waits, the next is refused.
        wait_until(lambda: entered, timeout_s=10, what="the first scrape in its handler")
        with clients(listener.port, 2, HEAD) as others:
            refused = wait_until(
                lambda: select.select(others, [], [], 0)[0],
                timeout_s=10,
                what="an answer to one of the two",
            )
            assert len(refused) == 1
            assert status(answer(refused[0])) == 503
            (waiting,) = [s for s in others if s is not refused[0]]
            release.set()
            assert [status(answer(first)), status(answer(waiting))] == [200, 200]
    assert entered == ["/metrics", "/metrics"]


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET /healthz HTTP/2\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431),
        (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"x" * 20_000 + b"\r\n\r\n", 431),
        (b"POST /echo HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", 413),
        (b"PUT /healthz HTTP/1.1\r\n\r\n", 405),
        (b"GET /nothing HTTP/1.1\r\n\r\n", 404),
    ],
)
def test_bad_requests_get_their_status_and_the_connection_closed(sent: bytes, expected: int):
    with serving(threading.Event()) as (listener, _), clients(listener.port, 1, sent) as (sock,):
        assert status(answer(sock)) == expected


def test_a_body_sent_after_the_head_and_one_behind_expect_100_continue_are_read_whole():
    with serving(threading.Event()) as (listener, _):
        with clients(listener.port, 1, b"POST /echo HTTP/1.1\r\nContent-Length: 6\r\n\r\nab") as (
            sock,
        ):
            sock.sendall(b"cdef")
            assert answer(sock).endswith(b"\r\n\r\nabcdef")
        head = b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
        with clients(listener.port, 1, head) as (sock,):
            assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(b"xyz")
            assert answer(sock).endswith(b"\r\n\r\nxyz")
