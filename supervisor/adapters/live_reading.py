"""The server tree's memory read when asked (a /metrics scrape, a textfile write), not taken from
the watchdog's last `memory_report` (one a minute): one cgroup file read, or the tree's /proc
status files with a cap on how many.

The read runs on a worker thread of its own and the asker waits for it at most `wait_s`: a /proc
read that hangs (a process stuck in the kernel) holds that one thread, never the HTTP listener
or the watchdog, and the scrape then shows the last reported value. At most one read is in
flight; askers meanwhile share it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path

from supervisor.adapters.procfs import status_charged_bytes
from supervisor.core.ports import ServerHandle

# How long a scrape waits for a fresh reading before it shows the last reported one.
LIVE_WAIT_S = 0.5
# The most processes a /proc read of the tree visits (SGLang's tree is a few dozen).
MAX_TREE_PROCESSES = 256
MAX_READS = 2048  # status and per-thread children files in all: a rank runs dozens of threads

Source = Callable[[], int | None]


class LiveReading:
    """A number read on demand through `source` (None: nothing to read now)."""

    def __init__(self, wait_s: float = LIVE_WAIT_S) -> None:
        self.wait_s = wait_s
        self._source: Source | None = None
        self._pending: concurrent.futures.Future[int | None] | None = None
        self._lock = threading.Lock()

    def set_source(self, source: Source | None) -> None:
        with self._lock:
            self._source = source
            self._pending = None  # a read of the previous server is not this one's

    def read(self) -> int | None:
        """A fresh value, or None: no source, the read failed, or it took over `wait_s`."""
        with self._lock:
            if self._source is None:
                return None
            if self._pending is None or self._pending.done():
                self._pending = _start(self._source)
            pending = self._pending
        try:
            return pending.result(timeout=self.wait_s)
        except Exception:  # noqa: BLE001 - a timeout or a failed read: the reported value stands
            return None


def _start(source: Source) -> concurrent.futures.Future[int | None]:
    """`source()` on a daemon thread (a read stuck in the kernel never holds up the exit)."""
    future: concurrent.futures.Future[int | None] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(source())
        except Exception as exc:  # noqa: BLE001 - handed to the asker
            future.set_exception(exc)

    threading.Thread(target=run, name="live-reading", daemon=True).start()
    return future


def tree_memory_source(server: ServerHandle, proc: Path = Path("/proc")) -> Source:
    """anon + shmem of the tree: its cgroup's charge (one read), else the RssAnon + RssShmem of
    the main process and its descendants from /proc, at most MAX_TREE_PROCESSES of them."""

    def read() -> int | None:
        charged = server.charged_bytes()
        return charged if charged is not None else proc_tree_bytes(server.pid, proc)

    return read


def proc_tree_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """RssAnon + RssShmem over `pid` and its descendants (found in each thread's `children`
    file), at most MAX_TREE_PROCESSES processes and MAX_READS file reads; None when `pid` is
    gone."""
    total, todo = 0, [pid]
    seen: set[int] = set()
    budget = [MAX_READS]
    while todo and len(seen) < MAX_TREE_PROCESSES and budget[0] > 0:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        budget[0] -= 1
        charged = _charged_bytes(proc / str(current) / "status")
        if charged is None:
            if current == pid:
                return None
            continue
        total += charged
        todo += _children(proc / str(current) / "task", budget)
    return total


def _charged_bytes(status: Path) -> int | None:
    try:
        return status_charged_bytes(status.read_text(encoding="ascii", errors="replace"))
    except OSError:
        return None


def _children(tasks: Path, budget: list[int]) -> list[int]:
    try:
        threads = sorted(tasks.iterdir())
    except OSError:
        return []
    out: list[int] = []
    for task in threads:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        try:
            out += [int(c) for c in (task / "children").read_text().split() if c.isdigit()]
        except OSError:
            continue
    return out
