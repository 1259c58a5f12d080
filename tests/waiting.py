"""Wait for a condition with a deadline instead of sleeping (no sleeps as synchronisation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    what: str,
    context: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy; fail naming `what` at the deadline,
    with `context()` as it is then (a log's tail, say)."""
    deadline = time.monotonic() + timeout_s
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            seen = f"; {context()}" if context is not None else ""
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {what} (last: {last!r}){seen}"
            )
        time.sleep(interval_s)
        last = predicate()
    return last
