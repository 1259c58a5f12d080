"""Memory pressure (PSI) from /proc/pressure/memory: `some` and `full` avg10, in percent.

Read by polling (~5 µs per read); None when the kernel has no PSI
(CONFIG_PSI off, or `psi=0` on RHEL-8-family kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPressure:
    some_avg10: float
    full_avg10: float | None  # `full` appeared in Linux 5.13 for the system-wide file


def parse_pressure(text: str) -> MemoryPressure | None:
    """Parse `some avg10=0.00 avg60=... total=...` / `full ...` lines; None when malformed."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            key, _, value = field.partition("=")
            if key == "avg10":
                try:
                    values[kind] = float(value)
                except ValueError:
                    return None
    if "some" not in values:
        return None
    return MemoryPressure(some_avg10=values["some"], full_avg10=values.get("full"))


def read_memory_pressure(proc_root: Path = Path("/proc")) -> MemoryPressure | None:
    """System-wide memory PSI, or None when unavailable."""
    try:
        text = (proc_root / "pressure" / "memory").read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return parse_pressure(text)
