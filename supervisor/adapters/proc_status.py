"""Cheap re-read of known processes between full tree scans: one /proc/PID/status per process.

A full scan (adapters.procfs) reads /proc/*/stat of every process on the box (~3 ms for 150
processes); the watchdog needs that about every few seconds to find new members, but reads its
known PIDs every tick (50 ms near a threshold). status alone has the state, the Rss* split and
the thread count; the title and process group come from the last scan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from supervisor.core.readings import ProcessInfo

_KIB = 1024


def refresh(
    known: Iterable[ProcessInfo], proc_root: Path = Path("/proc")
) -> tuple[ProcessInfo, ...]:
    """The known processes with fresh state and memory; vanished ones are left out."""
    out = []
    for info in known:
        try:
            raw = (proc_root / str(info.pid) / "status").read_bytes()
        except OSError:
            continue
        fields: dict[bytes, bytes] = {}
        for line in raw.splitlines():
            key, _, value = line.partition(b":")
            if key in (b"State", b"PPid", b"RssAnon", b"RssShmem", b"RssFile", b"Threads"):
                fields[key] = value.strip()
        try:
            out.append(
                dataclasses.replace(
                    info,
                    state=fields.get(b"State", b"?")[:1].decode("ascii", "replace"),
                    ppid=int(fields.get(b"PPid", str(info.ppid).encode())),
                    rss_anon_bytes=_kib(fields.get(b"RssAnon")),
                    rss_shmem_bytes=_kib(fields.get(b"RssShmem")),
                    rss_file_bytes=_kib(fields.get(b"RssFile")),
                    threads=int(fields.get(b"Threads", b"1")),
                )
            )
        except ValueError:
            continue
    return tuple(out)


def _kib(value: bytes | None) -> int:
    if not value:
        return 0
    number = value.split()[0]
    return int(number) * _KIB if number.isdigit() else 0
