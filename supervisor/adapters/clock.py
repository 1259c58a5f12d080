"""The real clock: monotonic time for deadlines, wall time only for timestamps in files."""

from __future__ import annotations

import time


class SystemClock:
    """Implements ports.Clock with time.monotonic (never the wall clock for deadlines)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wall(self) -> float:
        """Seconds since the epoch, for timestamps people read."""
        return time.time()
