"""core.ports.Reservations and its ReservationBook in one: the other instances' claims given
by the test, this instance's calls recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from supervisor.core.ledger import Reservation


class FakeLedger:
    def __init__(self, others: tuple[Reservation, ...] = ()) -> None:
        self._others = others
        self.calls: list[tuple[str, int, int]] = []  # ("set", planned, pinned) | ("drop", 0, 0)
        self.locked = False

    @contextlib.contextmanager
    def session(self) -> Iterator[FakeLedger]:
        self.locked = True
        try:
            yield self
        finally:
            self.locked = False

    def others(self) -> tuple[Reservation, ...]:
        assert self.locked, "read outside the lock: the check and the claim would race"
        return self._others

    def set(self, planned_bytes: int, pinned_bytes: int = 0) -> None:
        self.calls.append(("set", planned_bytes, pinned_bytes))

    def drop(self) -> None:
        self.calls.append(("drop", 0, 0))
