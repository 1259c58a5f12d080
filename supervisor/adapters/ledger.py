"""The host-wide reservation ledger on disk (rules in core.ledger).

`<dir>/ledger.json` holds the entries; `<dir>/ledger.lock` is flock()ed around every read and
write, so a pre-flight and the reservation it leads to are one step for every instance of the
host. The file is replaced atomically. A ledger that cannot be read or written (no such
directory and no right to create it, a damaged file) never stops a start: it counts as empty
and says so once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.atomic_file import NotRegularFile, open_regular, write_text_atomic
from supervisor.core import ledger
from supervisor.core.bounded import parse_json
from supervisor.core.ledger import Reservation

if TYPE_CHECKING:
    from supervisor.adapters.procfs import ProcReader


def _warn(event: str, **kv: object) -> None:
    # structlog only when there is something to say: the pre-flight's cold start never pays.
    import structlog

    structlog.get_logger("supervisor.ledger").warning(event, **kv)


LEDGER_FILE = "ledger.json"
LOCK_FILE = "ledger.lock"
# A holder keeps the lock for one pre-flight (well under a second, NVML's deadline at worst):
# waiting longer means a stuck holder, and a start must not hang on it.
LOCK_WAIT_S = 30.0
_LOCK_POLL_S = 0.05


class LedgerSession:
    """The ledger while its lock is held: read the others, set or drop this supervisor's
    entry."""

    def __init__(self, book: Ledger, entries: tuple[Reservation, ...], writable: bool) -> None:
        self._book = book
        self._entries = entries
        self._writable = writable

    def others(self) -> tuple[Reservation, ...]:
        """Live entries of other supervisors with bytes still to pin."""
        return ledger.others(self._entries, self._book.self_pid, self._book.is_alive)

    def set(self, planned_bytes: int, pinned_bytes: int = 0) -> None:
        mine = Reservation(
            instance=self._book.instance,
            pid=self._book.self_pid,
            start_ticks=self._book.self_ticks,
            planned_bytes=max(0, planned_bytes),
            pinned_bytes=max(0, pinned_bytes),
            updated_at=time.time(),
        )
        self._write(ledger.replace_own(self._entries, mine.pid, mine, self._book.is_alive))

    def drop(self) -> None:
        pid = self._book.self_pid
        if any(e.pid == pid for e in self._entries):
            self._write(ledger.replace_own(self._entries, pid, None, self._book.is_alive))

    def _write(self, entries: tuple[Reservation, ...]) -> None:
        if not self._writable:
            return
        try:
            text = json.dumps(ledger.document(entries), indent=1) + "\n"
            write_text_atomic(self._book.path, text)
            self._entries = entries
        except OSError as exc:
            self._book.unavailable(f"cannot write {self._book.path}: {exc.strerror or exc}")


class Ledger:
    """The ledger in `directory` as seen by this supervisor (`instance`)."""

    def __init__(self, directory: Path, instance: str, proc: ProcReader | None = None) -> None:
        self.directory = directory
        self.path = directory / LEDGER_FILE
        self.instance = instance
        if proc is None:
            # Here, not at import: a planning pre-flight never opens the ledger, and /proc's
            # reader is a few ms of its cold start.
            from supervisor.adapters.procfs import ProcReader

            proc = ProcReader()
        self.proc = proc
        self.self_pid = os.getpid()
        self.self_ticks = self.proc.start_ticks(self.self_pid) or 0
        self._warned = False

    def is_alive(self, pid: int, start_ticks: int) -> bool:
        return self.proc.is_running(pid, start_ticks)

    def unavailable(self, why: str) -> None:
        if not self._warned:
            _warn("ledger_unavailable", reason=why, path=str(self.directory))
            self._warned = True

    @contextlib.contextmanager
    def session(self) -> Iterator[LedgerSession]:
        """The ledger under its lock (an empty, read-only one when it cannot be had)."""
        fd = self._lock()
        try:
            yield LedgerSession(self, self._read() if fd is not None else (), fd is not None)
        finally:
            if fd is not None:
                os.close(fd)  # drops the flock

    def others(self) -> tuple[Reservation, ...]:
        """A read without the lock (the file is only ever replaced whole) that creates nothing:
        for a pre-flight that reserves nothing."""
        if not self.directory.is_dir():
            return ()
        return ledger.others(self._read(), self.self_pid, self.is_alive)

    def set(self, planned_bytes: int, pinned_bytes: int = 0) -> None:
        with self.session() as book:
            book.set(planned_bytes, pinned_bytes)

    def drop(self) -> None:
        with self.session() as book:
            book.drop()

    def _lock(self) -> int | None:
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            # Never through a link: root would create or lock whatever it points at.
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(self.directory / LOCK_FILE, flags, 0o644)
        except OSError as exc:
            self.unavailable(f"cannot open {self.directory / LOCK_FILE}: {exc.strerror or exc}")
            return None
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    self.unavailable(f"locked by another process for over {LOCK_WAIT_S:g} s")
                    return None
                time.sleep(_LOCK_POLL_S)

    def _read(self) -> tuple[Reservation, ...]:
        try:  # never a FIFO (it would block the read), never through a link
            with open_regular(self.path, follow_symlinks=False) as fh:
                raw = fh.read()
        except FileNotFoundError:
            return ()
        except NotRegularFile as exc:
            _warn("ledger_damaged", path=str(self.path), detail=str(exc))
            return ()
        except OSError as exc:
            self.unavailable(f"cannot read {self.path}: {exc.strerror or exc}")
            return ()
        try:
            return ledger.parse(parse_json(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError):
            _warn("ledger_damaged", path=str(self.path), detail="starting it afresh")
            return ()


def open_ledger(directory: str, instance: str, *, planning: bool = False) -> Ledger | None:
    """The ledger `[preflight] ledger_dir` names; None when it is off ("") or the pre-flight
    plans another host (its facts given: this host's instances are not its business)."""
    if not directory or planning:
        return None
    return Ledger(Path(directory), instance)
