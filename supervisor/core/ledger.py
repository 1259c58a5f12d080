"""The host-wide reservation ledger's rules: what a starting instance still has to pin, and
which entries count.

Two instances that start together both read the same MemAvailable; without a ledger both
pass the pre-flight and then allocate twice. Each starting instance records the host bytes its
pre-flight planned and, as its server pins memory, how much of that it holds already; another
instance's pre-flight subtracts what is planned but not yet pinned (MemAvailable shows the
rest). An entry counts only while its supervisor lives: the PID with its start time, so a
reused PID never keeps a dead entry alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

LEDGER_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """One starting instance's claim on host memory."""

    instance: str
    pid: int  # the supervisor's
    start_ticks: int  # its start time (clock ticks since boot)
    planned_bytes: int  # host bytes its pre-flight planned for the launch
    pinned_bytes: int = 0  # of those, what its server tree holds already
    updated_at: float = 0.0  # seconds since the epoch

    @property
    def outstanding_bytes(self) -> int:
        """Planned and not yet pinned: what MemAvailable does not show yet."""
        return max(0, self.planned_bytes - self.pinned_bytes)


# (pid, start_ticks) -> is that very process alive
IsAlive = Callable[[int, int], bool]


def parse(document: Any) -> tuple[Reservation, ...]:
    """The entries of a ledger document; malformed entries (or a document that is not a
    ledger) are skipped: a damaged ledger must never stop a start."""
    if not isinstance(document, Mapping):
        return ()
    entries = document.get("reservations")
    if not isinstance(entries, list):
        return ()
    out = []
    for item in entries:
        entry = _entry(item)
        if entry is not None:
            out.append(entry)
    return tuple(out)


def _entry(item: Any) -> Reservation | None:
    if not isinstance(item, Mapping):
        return None
    try:
        entry = Reservation(
            instance=str(item["instance"]),
            pid=int(item["pid"]),
            start_ticks=int(item["start_ticks"]),
            planned_bytes=int(item["planned_bytes"]),
            pinned_bytes=int(item.get("pinned_bytes", 0)),
            updated_at=float(item.get("updated_at", 0.0)),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if entry.pid <= 0 or entry.planned_bytes < 0 or entry.pinned_bytes < 0:
        return None
    return entry


def document(entries: Iterable[Reservation]) -> dict[str, Any]:
    return {"version": LEDGER_VERSION, "reservations": [asdict(e) for e in entries]}


def live(entries: Iterable[Reservation], is_alive: IsAlive) -> tuple[Reservation, ...]:
    """The entries whose supervisor still runs."""
    return tuple(e for e in entries if is_alive(e.pid, e.start_ticks))


def others(
    entries: Iterable[Reservation], self_pid: int, is_alive: IsAlive
) -> tuple[Reservation, ...]:
    """Live entries of other supervisors that still have bytes to pin."""
    return tuple(
        e for e in live(entries, is_alive) if e.pid != self_pid and e.outstanding_bytes > 0
    )


def replace_own(
    entries: Iterable[Reservation], pid: int, mine: Reservation | None, is_alive: IsAlive
) -> tuple[Reservation, ...]:
    """The ledger after supervisor `pid` set its entry (`mine`) or dropped it (None); dead
    entries are dropped on the way."""
    kept = tuple(e for e in live(entries, is_alive) if e.pid != pid)
    return kept if mine is None else (*kept, mine)
