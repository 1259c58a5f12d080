"""sd_notify with the standard library: one AF_UNIX datagram to $NOTIFY_SOCKET per message.

No-op without $NOTIFY_SOCKET. '@' addresses are in the abstract namespace (docs/peers.md,
systemd's man/notify-selfcontained-example.py). Errors are swallowed and counted, and a send
never blocks (MSG_DONTWAIT): a missing notification, or a receiver that stopped reading, must
never take the supervisor down or stall it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

# EXTEND_TIMEOUT_USEC moves a deadline of minutes: once a second is plenty, and a full datagram
# queue (net.unix.max_dgram_qlen, 10 by default) must not be filled with them.
_EXTEND_EVERY_S = 1.0


class SdNotifier:
    """Implements ports.Notifier for systemd's Type=notify units."""

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
        self.errors = 0
        self._watchdog_usec = _watchdog_usec(env)
        self._monotonic = monotonic
        self._extended_at = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to send WATCHDOG=1: half of WatchdogSec; None when the watchdog is off."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 2e6

    def notify(self, *lines: str) -> bool:
        """Send newline-separated KEY=VALUE lines as one datagram; False when not sent."""
        if self.address is None:
            return False
        payload = "\n".join(lines).encode("utf-8", errors="replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.send(payload, socket.MSG_DONTWAIT)
        except OSError:
            self.errors += 1
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        now = self._monotonic()
        if now - self._extended_at < _EXTEND_EVERY_S:
            return False
        self._extended_at = now
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1e6))}")

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))


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
