"""The supervisor's one HTTP listener: a route table served by http.server in daemon threads.

Whoever has an endpoint adds a route (`/metrics` is the first); the listener knows nothing of
what it serves. It never writes to stderr: a JSON log must stay JSON lines.
"""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# A client that stops sending mid-request is dropped after this: it holds one thread only.
REQUEST_TIMEOUT_S = 10.0
MAX_BODY_BYTES = 1 << 20


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


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], routes: Mapping[tuple[str, str], Handler]):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.routes = routes
        super().__init__(address, _RequestHandler)

    def handle_error(self, request: object, client_address: object) -> None:
        """A broken connection is the client's business, not a traceback on stderr."""


class _RequestHandler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        method = "GET" if self.command == "HEAD" else self.command
        handler = self.server.routes.get((method, url.path))
        if handler is None:
            known = any(path == url.path for _, path in self.server.routes)
            self._send(Response(405 if known else 404, b"method not allowed\n" if known else b""))
            return
        length_text = self.headers.get("Content-Length") or "0"
        length = int(length_text) if length_text.isdigit() else -1
        if length < 0:
            self._send(Response(400, b"bad Content-Length\n"))
            return
        if length > MAX_BODY_BYTES:
            self._send(Response(413, b"request body too large\n"))
            return
        request = Request(
            method=self.command,
            path=url.path,
            query=urllib.parse.parse_qs(url.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self.rfile.read(length) if length > 0 else b"",
        )
        try:
            response = handler(request)
        except Exception:  # noqa: BLE001 - an endpoint's bug answers 500, the listener lives on
            response = Response(500, b"internal error\n")
        self._send(response)

    def _send(self, response: Response) -> None:
        body = response.body or (b"not found\n" if response.status == 404 else b"")
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        """Requests are not logged (a scrape every 15 s would flood the journal)."""


class HttpListener:
    """Routes on one address, served from a daemon thread between start() and close()."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._routes: dict[tuple[str, str], Handler] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def route(self, path: str, handler: Handler, methods: tuple[str, ...] = ("GET",)) -> None:
        """Serve `path` with `handler` (HEAD is answered wherever GET is); also once started."""
        for method in methods:
            self._routes[(method, path)] = handler

    def start(self) -> tuple[str, int]:
        """Bind and serve; the address bound (port 0 picks a free one).

        Raises:
            OSError: the address cannot be bound (in use, not this host's, no permission).
        """
        self._server = _Server((self.host, self.port), self._routes)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="http-listener",
            daemon=True,
        )
        self._thread.start()
        return self.host, self.port

    def close(self) -> None:
        """Stop serving and release the port (requests in flight finish in their threads)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
        self._server = None
