"""sd_notify with the standard library: one AF_UNIX datagram to $NOTIFY_SOCKET per message.

No-op without $NOTIFY_SOCKET. '@' addresses are in the abstract namespace (docs/peers.md,
systemd's man/notify-selfcontained-example.py). A send never blocks (MSG_DONTWAIT): a receiver
that stopped reading must never stall the supervisor. What a full queue costs depends on the
message: `STATUS=`, `WATCHDOG=1` and `EXTEND_TIMEOUT_USEC=` are dropped (and counted: the next
one says the same, newer), while `READY=1` and `STOPPING=1` stay pending and are sent again,
first, at every later call until one gets through: systemd must see both state changes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

import structlog

log = structlog.get_logger("supervisor.systemd")

# EXTEND_TIMEOUT_USEC moves a deadline of minutes: once a second is plenty, and a full datagram
# queue (net.unix.max_dgram_qlen, 10 by default) must not be filled with them.
_EXTEND_EVERY_S = 1.0
# Drops are told in the log at most this often (and once more at exit): a receiver that stopped
# reading would otherwise add a line per tick.
_DROP_REPORT_EVERY_S = 600.0


class SdNotifier:
    """Implements ports.Notifier for systemd's Type=notify units; safe from any thread."""

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if raw.startswith("@"):
            self.address = b"\0" + raw[1:].encode()
        elif raw.startswith("/"):
            self.address = raw
        self.errors = 0  # sends that failed, retries of pending messages included
        self.dropped = 0  # STATUS=, WATCHDOG=1 and EXTEND_TIMEOUT_USEC= not sent
        self._watchdog_usec = _watchdog_usec(env)
        self._monotonic = monotonic
        self._extended_at = float("-inf")
        self._lock = threading.Lock()
        self._pending: list[str] = []  # READY=1 / STOPPING=1 datagrams not sent yet, in order
        self._starting = True  # until READY=1 or STOPPING=1 is asked for
        self._reported_drops = 0
        self._reported_at = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to send WATCHDOG=1: half of WatchdogSec; None when the watchdog is off."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 2e6

    @property
    def pending(self) -> tuple[str, ...]:
        """READY=1 / STOPPING=1 messages still waiting for the receiver to read."""
        with self._lock:
            return tuple(self._pending)

    def notify(self, *lines: str) -> bool:
        """Send newline-separated KEY=VALUE lines as one datagram, after any pending READY=1 or
        STOPPING=1; False (counted as dropped) when not sent."""
        if self.address is None:
            return False
        with self._lock:
            sent = self._flush() and self._send("\n".join(lines))
            if not sent:
                self.dropped += 1
            return sent

    def ready(self, status: str | None = None) -> bool:
        """READY=1: True when sent now, else pending until a later call gets it through."""
        return self._must_send("READY=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        sent = self.notify("WATCHDOG=1")
        self.report_drops()
        return sent

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC while the unit is starting. Once READY=1 or STOPPING=1 is asked
        for it would move another deadline (a stop's TimeoutStopSec), so it is not sent."""
        with self._lock:
            now = self._monotonic()
            if not self._starting or now - self._extended_at < _EXTEND_EVERY_S:
                return False
            self._extended_at = now
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1e6))}")

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1: True when sent now, else pending like READY=1."""
        return self._must_send("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def report_drops(self, *, at_exit: bool = False) -> None:
        """Log the messages dropped since the last report (at most every 10 min), and at exit
        what systemd never got. Logged outside the lock: a log sink may notify in turn."""
        with self._lock:
            now = self._monotonic()
            new = self.dropped - self._reported_drops
            due = at_exit or now - self._reported_at >= _DROP_REPORT_EVERY_S
            if not (new and due) and not (at_exit and self._pending):
                return
            self._reported_drops, self._reported_at = self.dropped, now
            pending = [message.split("\n", 1)[0] for message in self._pending]
        log.warning(
            "sd_notify_dropped",
            dropped=self.dropped,
            dropped_since_last=new,
            pending=pending,
            detail="systemd is not reading the notify socket; the newest status is sent next",
        )

    def _must_send(self, *lines: str) -> bool:
        if self.address is None:
            return False
        with self._lock:
            self._starting = False
            self._pending.append("\n".join(lines))
            return self._flush()

    def _flush(self) -> bool:
        """Send the pending messages in order (lock held); True when none is left."""
        while self._pending:
            if not self._send(self._pending[0]):
                return False
            self._pending.pop(0)
        return True

    def _send(self, payload: str) -> bool:
        assert self.address is not None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.send(payload.encode("utf-8", errors="replace"), socket.MSG_DONTWAIT)
        except OSError:
            self.errors += 1
            return False
        return True


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    raw = env.get("WATCHDOG_USEC")
    if not raw or not raw.isdigit() or int(raw) == 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None  # meant for another process (sd_watchdog_enabled(3))
    return int(raw)
