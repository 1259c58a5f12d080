"""What tests, the soak and the group harness read of processes in /proc: a command line, and
the live processes whose environment carries a mark (how "nothing left" is checked)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path


def cmdline(pid: int) -> str:
    """The command line, arguments joined by spaces; "" once the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def alive(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead (its state in /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def pids_with_env(matches: Callable[[Sequence[bytes]], bool]) -> list[int]:
    """Live (not zombie, not dead) processes but this one whose environment `matches`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        if matches(environ) and stat[stat.rfind(")") + 2] not in "ZX":
            found.append(int(entry.name))
    return found
