"""Read server process trees from /proc: ProcessInfo values (state, Rss*, threads, title).

The root is injectable so tests point it at a fake tree (earlyoom's `procdir_path`). Every read
tolerates a PID that vanished between listing and reading: it is simply left out.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from supervisor.core.ownership import ProcessMarks
from supervisor.core.readings import ProcessInfo
from supervisor.core.units import KiB

# Set in the server's environment; inherited by every descendant, setsid or double-forked ones
# included, so escapees of the process group are still recognised as ours.
INSTANCE_ENV = "SGLANG_SUPERVISOR_INSTANCE"
RUN_ENV = "SGLANG_SUPERVISOR_RUN_ID"
# "<pid>:<start ticks>" of the supervisor that launched the tree: a marked process whose
# supervisor still lives is not a leftover, it belongs to a running supervisor.
SUPERVISOR_ENV = "SGLANG_SUPERVISOR_PID"


def parse_stat(pid: int, text: str) -> _Stat | None:
    """/proc/PID/stat: comm may contain spaces and parentheses, so it ends at the last ")"."""
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    fields = text[close_at + 2 :].split()
    try:
        return _Stat(
            pid=pid,
            comm=text[open_at + 1 : close_at],
            state=fields[0],
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            start_ticks=int(fields[19]),
            # field 52, a zombie's wait status (Linux >= 3.5)
            exit_status=int(fields[49]) if fields[0] == "Z" and len(fields) > 49 else None,
        )
    except (IndexError, ValueError):
        return None


def title_from_cmdline(raw: bytes) -> str:
    """/proc/PID/cmdline as ps shows it. setproctitle writes the title over the argv area and
    pads the rest with spaces (or NULs), so the padding is stripped."""
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip()


def parse_status(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def info_from(stat: _Stat, status: dict[str, str], title: str) -> ProcessInfo:
    """A ProcessInfo from a stat line (state, group, start, exit status) and a status file
    (parent, memory)."""
    return ProcessInfo(
        pid=stat.pid,
        ppid=_int(status.get("PPid"), default=stat.ppid),
        pgid=stat.pgid,
        # The stat line's state, not status's read after it: a process that became a zombie in
        # between would read Z without the exit status stat had no field for yet.
        state=stat.state,
        title=title or stat.comm,
        rss_anon_bytes=_kib(status.get("RssAnon")),
        rss_shmem_bytes=_kib(status.get("RssShmem")),
        rss_file_bytes=_kib(status.get("RssFile")),
        threads=_int(status.get("Threads"), default=1),
        start_ticks=stat.start_ticks,
        exit_status=stat.exit_status,
    )


@dataclass(frozen=True, slots=True)
class _Stat:
    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    start_ticks: int
    exit_status: int | None = None


class ProcReader:
    """Reads /proc (or a fake root)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.root = proc_root

    # -- single processes ---------------------------------------------------------------

    def pids(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return [int(n) for n in names if n.isdigit()]

    def _stat(self, pid: int) -> _Stat | None:
        try:
            text = (self.root / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        return parse_stat(pid, text)

    def start_ticks(self, pid: int) -> int | None:
        """Start time in clock ticks since boot: with the PID, identifies a process (no reuse)."""
        stat = self._stat(pid)
        return stat.start_ticks if stat else None

    def is_running(self, pid: int, start_ticks: int) -> bool:
        """That very process (PID and start time) runs: neither gone, nor a zombie, nor reused."""
        stat = self._stat(pid)
        return stat is not None and stat.start_ticks == start_ticks and stat.state not in "ZX"

    def title(self, pid: int) -> str:
        """The command line as ps shows it; the comm for zombies and kernel threads."""
        try:
            raw = (self.root / str(pid) / "cmdline").read_bytes()
        except OSError:
            raw = b""
        title = title_from_cmdline(raw)
        if title:
            return title
        stat = self._stat(pid)
        return stat.comm if stat else ""

    def environ_has(self, pid: int, name: str, value: str | None = None) -> bool:
        """Whether the process environment sets `name` (to `value` when given)."""
        found = self.environ_value(pid, name)
        return found is not None and (value is None or found == value)

    def environ_value(self, pid: int, name: str) -> str | None:
        """The value of `name` in the process environment (None: unset or unreadable)."""
        return self._environ(pid, (name,)).get(name)

    def _environ(self, pid: int, names: Iterable[str]) -> dict[str, str]:
        """The values of `names` in one read of /proc/PID/environ (unset ones left out)."""
        try:
            raw = (self.root / str(pid) / "environ").read_bytes()
        except OSError:
            return {}
        wanted = {f"{name}=".encode(): name for name in names}
        found: dict[str, str] = {}
        for entry in raw.split(b"\0"):
            key, eq, value = entry.partition(b"=")
            name = wanted.get(key + eq)
            if name is not None:
                found[name] = value.decode(errors="replace")
        return found

    def pids_marked(self, name: str, matches: Callable[[str], bool]) -> list[int]:
        """Live processes (no zombies) whose environment sets `name` to a value `matches`
        accepts; this process left out. A full scan: one environ read per process."""
        found = []
        for pid in self.pids():
            value = self.environ_value(pid, name) if pid != os.getpid() else None
            if value is not None and matches(value):
                stat = self._stat(pid)
                if stat is not None and stat.state not in "ZX":
                    found.append(pid)
        return found

    def supervisor_mark(self) -> str:
        """This process as SUPERVISOR_ENV spells it: "<pid>:<start ticks>"."""
        pid = os.getpid()
        return f"{pid}:{self.start_ticks(pid) or 0}"

    def marks(self, pid: int) -> ProcessMarks | None:
        """What identifies `pid` for core.ownership.whose, None when it is gone."""
        stat = self._stat(pid)
        return None if stat is None else self._marks(stat)

    def scan_marks(self, exclude: Iterable[int] = ()) -> tuple[ProcessMarks, ...]:
        """The marks of every process on the host (a full scan, environments included)."""
        skip = set(exclude)
        return tuple(self._marks(s) for s in self._all_stats() if s.pid not in skip)

    def _marks(self, stat: _Stat) -> ProcessMarks:
        env = self._environ(stat.pid, (SUPERVISOR_ENV, INSTANCE_ENV))
        launched_by = env.get(SUPERVISOR_ENV)
        return ProcessMarks(
            pid=stat.pid,
            start_ticks=stat.start_ticks,
            state=stat.state,
            title=self.title(stat.pid),
            instance=env.get(INSTANCE_ENV),
            launched_by=launched_by,
            launcher_alive=launched_by is not None and self._is_alive_mark(launched_by),
        )

    def _is_alive_mark(self, mark: str) -> bool:
        """Whether "<pid>:<start ticks>" names a process that still runs."""
        owner, _, ticks = mark.partition(":")
        if not owner.isdigit():
            return False
        stat = self._stat(int(owner))
        return stat is not None and stat.state not in "ZX" and str(stat.start_ticks) == ticks

    def read_process(self, pid: int) -> ProcessInfo | None:
        """One process, or None when it is gone (or unreadable)."""
        stat = self._stat(pid)
        if stat is None:
            return None
        return self._info(stat)

    def refresh(self, known: Iterable[ProcessInfo]) -> tuple[ProcessInfo, ...]:
        """The known processes with fresh state and memory, from /proc/PID/status alone.

        One read per process instead of a scan of every /proc/*/stat on the box: what the
        watchdog and the run loop do between full scans. Title and group are kept from the last
        scan; vanished or unreadable processes are left out.
        """
        out = []
        for info in known:
            fields = self._status(info.pid)
            ppid = _int(fields.get("PPid") if fields else None, default=-1)
            if fields is None or ppid < 0:
                continue
            out.append(
                dataclasses.replace(
                    info,
                    state=fields.get("State", "?")[:1],
                    ppid=ppid,
                    rss_anon_bytes=_kib(fields.get("RssAnon")),
                    rss_shmem_bytes=_kib(fields.get("RssShmem")),
                    rss_file_bytes=_kib(fields.get("RssFile")),
                    threads=_int(fields.get("Threads"), default=1),
                )
            )
        return tuple(out)

    def _status(self, pid: int) -> dict[str, str] | None:
        try:
            text = (self.root / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        return parse_status(text)

    def _info(self, stat: _Stat) -> ProcessInfo | None:
        fields = self._status(stat.pid)
        if fields is None:
            return None
        return info_from(stat, fields, self.title(stat.pid))

    # -- trees ----------------------------------------------------------------------------

    def _all_stats(self) -> list[_Stat]:
        return [s for s in (self._stat(pid) for pid in self.pids()) if s is not None]

    def server_tree(
        self,
        *,
        server_pid: int,
        pgid: int,
        subreaper_pid: int,
        run_id: str | None = None,
        known_pids: Iterable[int] = (),
    ) -> tuple[ProcessInfo, ...]:
        """Every process of the server: its process group, its descendants, and escapees.

        Escapees (setsid or double-forked) are reparented to the supervisor, a child subreaper:
        a child of `subreaper_pid` other than the server counts when it carries the run's
        environment marker or was seen in the tree before (`known_pids`, e.g. a zombie whose
        environment can no longer be read). The supervisor itself is never included.
        """
        members = self.server_tree_pids(
            server_pid=server_pid,
            pgid=pgid,
            subreaper_pid=subreaper_pid,
            run_id=run_id,
            known_pids=known_pids,
        )
        return self.processes(members)

    def server_tree_pids(
        self,
        *,
        server_pid: int,
        pgid: int,
        subreaper_pid: int,
        run_id: str | None = None,
        known_pids: Iterable[int] = (),
    ) -> list[int]:
        """The PIDs `server_tree` finds: one stat read per host process (the full scan)."""
        stats = self._all_stats()
        children: dict[int, list[int]] = {}
        for s in stats:
            children.setdefault(s.ppid, []).append(s.pid)
        known = set(known_pids)
        roots = {server_pid} | {s.pid for s in stats if s.pgid == pgid}
        for child in children.get(subreaper_pid, []):
            if child in roots:
                continue
            if child in known or (run_id is not None and self.environ_has(child, RUN_ENV, run_id)):
                roots.add(child)
        members = set(_descendants(roots, children))
        members.discard(subreaper_pid)
        return sorted(members)

    def processes(self, pids: Iterable[int]) -> tuple[ProcessInfo, ...]:
        """The given PIDs that still exist."""
        infos = (self.read_process(pid) for pid in pids)
        return tuple(i for i in infos if i is not None)

    def oom_kill_count(self) -> int | None:
        """The kernel's OOM-kill counter (/proc/vmstat `oom_kill`, Linux >= 4.13)."""
        try:
            text = (self.root / "vmstat").read_text(encoding="utf-8")
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return _int(value, default=0)
        return None


def _descendants(roots: Iterable[int], children: dict[int, list[int]]) -> Iterator[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        yield pid
        stack.extend(children.get(pid, ()))


def status_charged_bytes(text: str) -> int:
    """RssAnon + RssShmem of a /proc/PID/status text: what ProcessInfo.charged_bytes counts."""
    fields = parse_status(text)
    return _kib(fields.get("RssAnon")) + _kib(fields.get("RssShmem"))


def _kib(value: str | None) -> int:
    if not value:
        return 0
    number = value.split()[0]
    return int(number) * KiB if number.isdigit() else 0


def _int(value: str | None, *, default: int) -> int:
    try:
        return int((value or "").split()[0])
    except (IndexError, ValueError):
        return default
