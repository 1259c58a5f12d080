"""The supervisor's one HTTP listener: a route table served by a small, bounded server.

Whoever has an endpoint adds a route (`/metrics`, the probes `/healthz` and `/readyz`, the
group's); the listener knows nothing of what it serves. It never writes to stderr: a JSON log
must stay JSON lines.

Theory of operation. A kubelet gives a probe 1 s by default, and the probes must answer while
clients flood the port (a thread per connection and the default backlog of 5 took 1.5–11 s for
`/healthz` under 200 local clients). So:

- one intake thread (adapters/http_intake.py) accepts with a backlog of LISTEN_BACKLOG and reads
  every connection without blocking until its request head is complete: an idle or slow client
  holds a slot among MAX_OPEN, never a thread, and is dropped after HEAD_TIMEOUT_S;
- a complete request goes to a bounded pool of threads: the probe routes (`probe=True`) to their
  own, every other request to the other, each pool's queue bounded too (a request that finds it
  full is answered 503 at once), so a probe never waits behind scrapes or slow handlers;
- a worker reads the rest of a body (at most MAX_BODY_BYTES), calls the handler and writes the
  answer, each within REQUEST_TIMEOUT_S; one request per connection (`Connection: close`).

Nothing a client does makes the threads or the memory grow: the pools' threads, their queues,
and MAX_OPEN heads of at most MAX_HEAD_BYTES.
"""

from __future__ import annotations

import contextlib
import http
import queue
import socket
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from supervisor.adapters.http_intake import LISTEN_BACKLOG, BadRequest, Head, Intake, parse_head

# A client that stops sending (or reading) mid-request is dropped after this.
REQUEST_TIMEOUT_S = 10.0
MAX_BODY_BYTES = 1 << 20
WORKERS = 4
PROBE_WORKERS = 2
QUEUED_PER_WORKER = 16
_JOIN_S = 5.0


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # without the query string
    query: Mapping[str, list[str]] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[Request], Response]


def encode(response: Response, *, head_only: bool = False) -> bytes:
    """The response as bytes on the wire (HTTP/1.1, the connection closed after it)."""
    body = response.body or (b"not found\n" if response.status == 404 else b"")
    try:
        phrase = http.HTTPStatus(response.status).phrase
    except ValueError:
        phrase = ""
    head = (
        f"HTTP/1.1 {response.status} {phrase}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else body)


def answer_now(sock: socket.socket, status: int, why: str = "") -> None:
    """A short answer from the intake thread, never waiting on the client; then close."""
    with sock:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.send(encode(Response(status, f"{why}\n".encode() if why else b"")))


@dataclass(frozen=True, slots=True)
class _Job:
    sock: socket.socket
    head: Head
    body_start: bytes  # what of the body came with the head
    handler: Handler | None  # None: no route (404, or 405 when `known_path`)
    known_path: bool


class _Pool:
    """`workers` threads serving jobs; at most `workers` × QUEUED_PER_WORKER waiting."""

    def __init__(self, name: str, workers: int, serve: Callable[[_Job], None]) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._limit = workers * QUEUED_PER_WORKER
        self._waiting = 0
        self._lock = threading.Lock()
        self._serve = serve
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def offer(self, job: _Job) -> bool:
        """Queue `job`; False when the queue is full (the caller answers 503)."""
        with self._lock:
            if self._waiting >= self._limit:
                return False
            self._waiting += 1
        self._jobs.put(job)
        return True

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
            self._serve(job)

    def close(self) -> None:
        """The threads end after the requests already queued (each waits at most
        REQUEST_TIMEOUT_S on its client)."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(_JOIN_S)


class HttpListener:
    """Routes on one address, served between start() and close()."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        # Read by the intake thread while route() may add to them: lookups only, no iteration.
        self._routes: dict[tuple[str, str], Handler] = {}
        self._paths: set[str] = set()
        self._probes: set[str] = set()
        self._sock: socket.socket | None = None
        self._intake: Intake | None = None
        self._thread: threading.Thread | None = None
        self._pools: dict[bool, _Pool] = {}
        self._closing = False

    def route(
        self,
        path: str,
        handler: Handler,
        methods: tuple[str, ...] = ("GET",),
        *,
        probe: bool = False,
    ) -> None:
        """Serve `path` with `handler` (HEAD is answered wherever GET is); also once started.
        `probe`: a liveness or readiness probe, served by threads of its own (keep it quick)."""
        for method in methods:
            self._routes[(method, path)] = handler
        self._paths.add(path)
        if probe:
            self._probes.add(path)

    def start(self) -> tuple[str, int]:
        """Bind and serve; the address bound (port 0 picks a free one).

        Raises:
            OSError: the address cannot be bound (in use, not this host's, no permission).
        """
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._closing = False
        self._pools = {
            True: _Pool("http-probe", PROBE_WORKERS, self._serve),
            False: _Pool("http-worker", WORKERS, self._serve),
        }
        self._intake = Intake(sock, self._deliver, answer_now)
        self._thread = threading.Thread(target=self._intake.run, name="http-listener", daemon=True)
        self._thread.start()
        return self.host, self.port

    def close(self) -> None:
        """Stop serving and release the port. A request in a handler finishes; those still
        queued are closed unanswered."""
        if self._sock is None or self._intake is None:
            return
        self._intake.stop()
        if self._thread is not None:
            self._thread.join(_JOIN_S)
        self._sock.close()
        self._closing = True
        for pool in self._pools.values():
            pool.close()
        self._sock = self._intake = self._thread = None

    # -- in the intake thread: route and queue, never wait -----------------------------------

    def _deliver(self, sock: socket.socket, raw_head: bytes, body_start: bytes) -> None:
        try:
            head = parse_head(raw_head)
        except BadRequest as exc:
            answer_now(sock, exc.status, str(exc))
            return
        path = urllib.parse.urlsplit(head.target).path
        method = "GET" if head.method == "HEAD" else head.method
        handler = self._routes.get((method, path))
        job = _Job(sock, head, body_start, handler, path in self._paths)
        if not self._pools[path in self._probes and handler is not None].offer(job):
            answer_now(sock, 503, "busy, try again")

    # -- in a pool's thread --------------------------------------------------------------------

    def _serve(self, job: _Job) -> None:
        with job.sock as sock:
            if self._closing:
                return
            try:
                sock.settimeout(REQUEST_TIMEOUT_S)
                response = self._respond(job)
                sock.sendall(encode(response, head_only=job.head.method == "HEAD"))
            except OSError:  # the client went away, or was too slow: its business
                pass

    def _respond(self, job: _Job) -> Response:
        if job.handler is None:
            if job.known_path:
                return Response(405, b"method not allowed\n")
            return Response(404)
        length_text = job.head.headers.get("content-length") or "0"
        if "transfer-encoding" in job.head.headers:
            return Response(411, b"a body needs a Content-Length\n")
        if not length_text.isdigit():
            return Response(400, b"bad Content-Length\n")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            return Response(413, b"request body too large\n")
        url = urllib.parse.urlsplit(job.head.target)
        request = Request(
            method=job.head.method,
            path=url.path,
            query=urllib.parse.parse_qs(url.query, max_num_fields=100),
            headers=job.head.headers,
            body=_read_body(job, length),
        )
        try:
            return job.handler(request)
        except Exception:  # noqa: BLE001 - an endpoint's bug answers 500, the listener lives on
            return Response(500, b"internal error\n")


def _read_body(job: _Job, length: int) -> bytes:
    """The body: what came with the head, then the rest from the socket (its timeout applies).

    Raises:
        OSError: the client closed or stalled before the whole body came.
    """
    body = bytearray(job.body_start[:length])
    if len(body) < length and job.head.headers.get("expect", "").lower() == "100-continue":
        job.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it before a body
    while len(body) < length:
        chunk = job.sock.recv(min(65536, length - len(body)))
        if not chunk:
            raise ConnectionError("the client closed before its body was complete")
        body += chunk
    return bytes(body)
