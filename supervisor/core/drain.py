"""SGLang's drain after SIGTERM, as its own log tells it (pure: lines and times in).

While it drains, SGLang's main process logs the requests still in flight
(managers/tokenizer_manager.py `sigterm_watchdog`, 0.5.23):

    [2026-01-01 00:00:00] Gracefully exiting... Remaining number of requests 1. Remaining
    requests remaining_rids=['…'].

at its first look (up to 5 s after the SIGTERM: the loop that notices the signal sleeps 5 s),
then every 5 s until none is left. So a stop whose grace runs out can say how many requests its
SIGKILL cut, as of SGLang's last look; a grace shorter than that first look sees no count.

The line is read only where the message starts (after SGLang's "[time prefix] "), with a
substring search and one anchored, bounded pattern: linear in the line, whatever its length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = "Gracefully exiting... Remaining number of requests "
# SGLang's prefix is "[%(asctime)s{ TPn}] ": the marker starts within the first few dozen
# characters. A longer window leaves room for a custom logging format, not for a whole line.
_WINDOW_CHARS = 256
_COUNT = re.compile(r"(\d{1,9})\.")


def remaining_requests(line: str) -> int | None:
    """The count of a "Remaining number of requests N." line, None for any other line."""
    at = line.find(MARKER, 0, _WINDOW_CHARS + len(MARKER))
    if at < 0:
        return None
    found = _COUNT.match(line, at + len(MARKER))
    return int(found.group(1)) if found is not None else None


@dataclass(frozen=True, slots=True)
class Remaining:
    """SGLang's last count of requests in flight, and when it was read (monotonic seconds)."""

    requests: int
    at_s: float


class DrainLog:
    """Fed every line of one launch's output; keeps the last count (one small record)."""

    def __init__(self) -> None:
        self.last: Remaining | None = None

    def feed(self, line: str, at_s: float) -> None:
        count = remaining_requests(line)
        if count is not None:
            self.last = Remaining(count, at_s)  # one reference swap: read from another thread

    def since(self, start_s: float) -> Remaining | None:
        """The last count read at or after `start_s` (this drain's SIGTERM), if any."""
        last = self.last
        return last if last is not None and last.at_s >= start_s else None
