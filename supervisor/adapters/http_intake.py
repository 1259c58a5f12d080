"""The listener's intake: one thread accepts connections and reads each without blocking until
its request head is complete, then hands it on; no client can hold it or grow what it keeps.

A connection that sends nothing, or a byte at a time (slowloris), costs one of MAX_OPEN slots
and at most MAX_HEAD_BYTES, never a thread: it is dropped HEAD_TIMEOUT_S after it was accepted,
or sooner when a new connection needs its slot (the oldest goes first; a probe connects, sends
its request at once and is read in the next turn). The end of a head is searched for only in
what arrived since the last look, so a head read a byte at a time is still linear work.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

LISTEN_BACKLOG = 512  # the kernel caps it at net.core.somaxconn
MAX_OPEN = 256  # connections being read at once
HEAD_TIMEOUT_S = 10.0  # from accept to a complete request head
MAX_HEAD_BYTES = 16 * 1024  # request line and headers
MAX_HEADERS = 100
_ACCEPT_BATCH = 64  # per turn, so the open connections are read between bursts
_READ_CHUNK = 4096
_ACCEPT_PAUSE_S = 0.1  # out of descriptors (EMFILE): the listening socket stays readable


class BadRequest(Exception):
    """A request head the listener answers itself (`status`, e.g. 400, 431)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


@dataclass(frozen=True, slots=True)
class Head:
    method: str
    target: str  # as sent: a path with its query (or an absolute URL)
    headers: dict[str, str]  # names lower-cased; a repeated name keeps its last value


def parse_head(raw: bytes) -> Head:
    """The request line and headers of `raw` (the head without its blank line).

    Raises:
        BadRequest: not an HTTP/1.x request line, a header line without a name, too many.
    """
    lines = raw.splitlines()
    parts = lines[0].split() if lines else []
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(400, "bad request line")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, "too many header fields")
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise BadRequest(400, "bad header line")
        headers[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
    return Head(parts[0].decode("latin-1"), parts[1].decode("latin-1"), headers)


def head_end(buf: bytearray, start: int) -> tuple[int, int] | None:
    """(where the head ends, where the body starts) once the blank line is in `buf`, looking
    from `start` on (a few bytes back: a CRLF may straddle two reads)."""
    start = max(0, start - 3)
    ends = [
        (at, at + len(sep)) for sep in (b"\r\n\r\n", b"\n\n") if (at := buf.find(sep, start)) >= 0
    ]
    return min(ends) if ends else None


@dataclass(eq=False, slots=True)
class _Open:
    sock: socket.socket
    deadline_s: float
    buf: bytearray = field(default_factory=bytearray)
    looked: int = 0  # bytes of buf already searched for the head's end


Deliver = Callable[[socket.socket, bytes, bytes], None]  # (connection, head, body bytes read)
Refuse = Callable[[socket.socket, int], None]  # (connection, status): answer it and close


class Intake:
    """Runs in its own thread (`run`) until `stop`; owns every connection until it delivers it."""

    def __init__(self, listening: socket.socket, deliver: Deliver, refuse: Refuse) -> None:
        self._listening = listening
        self._deliver = deliver
        self._refuse = refuse
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        # By descriptor, in accept order (= deadline order): the oldest is first, at O(1).
        self._open: collections.OrderedDict[int, _Open] = collections.OrderedDict()
        self._stopping = False
        self._paused_until_s: float | None = None
        listening.setblocking(False)
        self._wake_r.setblocking(False)
        self._selector.register(listening, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def run(self) -> None:
        try:
            while not self._stopping:
                for key, _events in self._selector.select(self._expire()):
                    if key.fileobj is self._listening:
                        self._accept()
                    elif isinstance(key.data, _Open):
                        self._read(key.data)
        finally:
            for conn in list(self._open.values()):
                self._drop(conn)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _expire(self) -> float | None:
        """Drop what ran out of time; how long the next select may wait."""
        now = time.monotonic()
        while self._open:
            oldest = next(iter(self._open.values()))
            if oldest.deadline_s > now:
                break
            self._drop(oldest)
        if self._paused_until_s is not None and now >= self._paused_until_s:
            self._paused_until_s = None
            self._selector.register(self._listening, selectors.EVENT_READ)
        wake_s = []
        if self._open:
            wake_s.append(next(iter(self._open.values())).deadline_s - now)
        if self._paused_until_s is not None:
            wake_s.append(self._paused_until_s - now)
        return max(0.0, min(wake_s)) if wake_s else None  # idle: asleep until a client or stop

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _address = self._listening.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors or memory: make room, pause accepting
                if self._open:
                    self._drop(next(iter(self._open.values())))
                else:
                    self._selector.unregister(self._listening)
                    self._paused_until_s = time.monotonic() + _ACCEPT_PAUSE_S
                return
            if len(self._open) >= MAX_OPEN:
                self._drop(next(iter(self._open.values())))
            sock.setblocking(False)
            conn = _Open(sock, time.monotonic() + HEAD_TIMEOUT_S)
            self._open[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Open) -> None:
        try:
            data = conn.sock.recv(_READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client gave up (or reset)
            self._drop(conn)
            return
        conn.buf += data
        found = head_end(conn.buf, conn.looked)
        conn.looked = len(conn.buf)
        if found is None and len(conn.buf) <= MAX_HEAD_BYTES:
            return
        self._release(conn)
        if found is None or found[0] > MAX_HEAD_BYTES:
            self._refuse(conn.sock, 431)
            return
        end, body = found
        try:
            self._deliver(conn.sock, bytes(conn.buf[:end]), bytes(conn.buf[body:]))
        except Exception:  # noqa: BLE001 - a bug must not end the listener, only this request
            conn.sock.close()

    def _release(self, conn: _Open) -> None:
        """The connection leaves the intake (delivered, refused or dropped)."""
        del self._open[conn.sock.fileno()]
        self._selector.unregister(conn.sock)

    def _drop(self, conn: _Open) -> None:
        self._release(conn)
        conn.sock.close()
