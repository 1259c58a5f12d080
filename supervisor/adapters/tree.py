"""The one reader of a server tree, shared by the run loop and the memory watchdog, and the
thread that turns a member's exit into an event.

Each member's `/proc/PID/stat` and `status` stay open and are re-read with pread: two syscalls
per member and read, and an open file keeps naming the same process (a recycled PID is a new
directory). A pidfd per member serves the kill (pidfd_send_signal, process_mrelease) and the
exit watch: a pidfd becomes readable when its process exits, so a dead rank is an event, not
something a 1 s tick finds.

A member's title is kept once it is SGLang's and no longer its parent's: a forked child carries
its parent's title until it execs or titles itself (a scheduler's subprocess during init, a spawn
child of the DP controller before its exec), so a title equal to the parent's is read again.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from supervisor.adapters.procfs import info_from, parse_stat, parse_status, title_from_cmdline
from supervisor.adapters.reclaim import open_pidfd
from supervisor.core.readings import ProcessInfo

# Open files per member: stat, status, pidfd (+ the watcher's dup). A tree this big is a fork
# bomb; its extra members are still read, just without kept-open files.
MAX_CACHED_MEMBERS = 256
_SGLANG_TITLE = "sglang::"


@dataclass
class _Member:
    stat_fd: int
    status_fd: int
    pidfd: int | None
    title: str
    settled: bool = False  # the title is final: SGLang's, and not inherited from the parent


def _pread_text(fd: int) -> str:
    return os.pread(fd, 65536, 0).decode("utf-8", errors="replace")


class TreeReader:
    """ProcessInfo for given PIDs from kept-open /proc files. Thread-safe."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.root = proc_root
        self._members: dict[int, _Member] = {}
        self._lock = threading.Lock()
        self.on_new_member: Callable[[int, int | None], None] = lambda _pid, _fd: None

    def read(self, pids: Iterable[int], *, titles: bool = False) -> tuple[ProcessInfo, ...]:
        """The given PIDs that still exist (zombies included). `titles`: re-read the command
        line of members whose title is not settled (a rank sets its title after it starts)."""
        out = []
        with self._lock:
            for pid in sorted(set(pids)):
                info = self._read_one(pid, titles)
                if info is not None:
                    out.append(info)
        return tuple(out)

    def pidfds(self) -> dict[int, int]:
        with self._lock:
            return {pid: m.pidfd for pid, m in self._members.items() if m.pidfd is not None}

    def known(self) -> set[int]:
        with self._lock:
            return set(self._members)

    def close(self) -> None:
        with self._lock:
            for pid in list(self._members):
                self._drop(pid)

    # -- under the lock ------------------------------------------------------------------

    def _read_one(self, pid: int, titles: bool) -> ProcessInfo | None:
        member = self._members.get(pid) or self._open(pid)
        if member is None:
            return self._read_uncached(pid)
        try:
            stat = parse_stat(pid, _pread_text(member.stat_fd))
            status = parse_status(_pread_text(member.status_fd))
        except OSError:  # gone (ESRCH): the files name a process that no longer exists
            self._drop(pid)
            return None
        if stat is None:
            return None
        if titles and not member.settled:
            member.title = self._title(pid) or member.title
            member.settled = self._is_settled(member.title, stat.ppid)
        return info_from(stat, status, member.title)

    def _open(self, pid: int) -> _Member | None:
        if len(self._members) >= MAX_CACHED_MEMBERS:
            return None
        base = self.root / str(pid)
        try:
            stat_fd = os.open(base / "stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            status_fd = os.open(base / "status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(stat_fd)
            return None
        pidfd = open_pidfd(pid) if self.root == Path("/proc") else None
        member = _Member(stat_fd, status_fd, pidfd, self._title(pid))
        ppid = self._ppid_of(stat_fd, pid)
        member.settled = ppid is not None and self._is_settled(member.title, ppid)
        self._members[pid] = member
        self.on_new_member(pid, pidfd)
        return member

    def _read_uncached(self, pid: int) -> ProcessInfo | None:
        base = self.root / str(pid)
        try:
            stat = parse_stat(pid, (base / "stat").read_text(errors="replace"))
            status = parse_status((base / "status").read_text(errors="replace"))
        except OSError:
            return None
        return None if stat is None else info_from(stat, status, self._title(pid))

    def _title(self, pid: int) -> str:
        try:
            raw = (self.root / str(pid) / "cmdline").read_bytes()
        except OSError:
            return ""
        return title_from_cmdline(raw)

    def _is_settled(self, title: str, ppid: int) -> bool:
        return title.startswith(_SGLANG_TITLE) and title != self._title(ppid)

    @staticmethod
    def _ppid_of(stat_fd: int, pid: int) -> int | None:
        try:
            stat = parse_stat(pid, _pread_text(stat_fd))
        except OSError:
            return None
        return None if stat is None else stat.ppid

    def _drop(self, pid: int) -> None:
        member = self._members.pop(pid, None)
        if member is None:
            return
        for fd in (member.stat_fd, member.status_fd, member.pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


class ExitWatcher:
    """A thread that calls `on_exit(pid)` when a watched process exits (its pidfd turns
    readable). Watched pidfds are duplicates it owns and closes."""

    def __init__(self, on_exit: Callable[[int], None]) -> None:
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}  # fd -> pid, to be registered
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="exit-watcher", daemon=True)
        self._thread.start()

    def watch(self, pid: int, pidfd: int | None) -> None:
        if pidfd is None:
            return
        try:
            fd = os.dup(pidfd)
        except OSError:
            return
        with self._lock:
            if self._closed:
                os.close(fd)
                return
            self._pending[fd] = pid
        self._wake()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(5.0)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        watched: dict[int, int] = {}
        try:
            while True:
                for fd, _mask in poller.poll():
                    if fd == self._wake_r:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                        continue
                    pid = watched.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    self._on_exit(pid)
                with self._lock:
                    if self._closed:
                        return
                    pending, self._pending = self._pending, {}
                for fd, pid in pending.items():
                    watched[fd] = pid
                    poller.register(fd, select.POLLIN)
        finally:
            for fd in [*watched, self._wake_r, self._wake_w, *self._pending]:
                with contextlib.suppress(OSError):
                    os.close(fd)
