"""Start the SGLang server in its own session, pump its output, signal and kill its whole tree.

Containment (docs/peers.md, killing a tree): `start_new_session` gives the tree one process
group; the supervisor is a child subreaper so escapees are reparented to it; the server asks for
SIGKILL when the supervisor dies (PR_SET_PDEATHSIG) and gets a raised oom_score_adj, inherited by
its children. Implements core.ports.LaunchedServer and ServerLauncher.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from supervisor.adapters.procfs import ProcReader
from supervisor.core.events import KillReason
from supervisor.core.readings import ExitStatus, ProcessInfo

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux >= 3.4): orphans of the tree come to us."""
    return bool(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _child_setup(parent_pid: int, oom_score_adj: int | None) -> Callable[[], None]:
    def setup() -> None:
        # Runs in the forked child before exec: only async-signal-safe-ish work, no logging.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the supervisor died before the prctl: nobody to watch
            os._exit(1)
        if oom_score_adj is not None:
            with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(oom_score_adj))

    return setup


class OutputPump:
    """Reads the server's merged stdout/stderr line by line and never blocks the server.

    The reader thread only reads, counts, redacts and keeps the tail; lines go to `sink` through a
    bounded queue drained by a second thread, so a slow log consumer (journald) drops lines
    (counted) instead of filling the pipe and stalling SGLang.
    """

    def __init__(
        self,
        stream: IO[bytes],
        sink: Callable[[str], None],
        redact: Callable[[str], str],
        tail_lines: int = 200,
        queue_lines: int = 10_000,
    ) -> None:
        self._stream = stream
        self._sink = sink
        self._redact = redact
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=queue_lines)
        self._lock = threading.Lock()
        self.lines = 0
        self.dropped = 0
        self._reader = threading.Thread(target=self._read, name="server-output", daemon=True)
        self._writer = threading.Thread(target=self._write, name="server-log", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def _read(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                line = self._redact(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                with self._lock:
                    self._tail.append(line)
                    self.lines += 1
                try:
                    self._queue.put_nowait(line)
                except queue.Full:
                    self.dropped += 1
        finally:
            self._stream.close()
            self._queue.put(None)

    def _write(self) -> None:
        while (line := self._queue.get()) is not None:
            self._sink(line)

    def tail(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._tail)

    def join(self, timeout_s: float) -> None:
        """Wait for the output to be drained (the pipe closes when the last writer exits)."""
        self._reader.join(timeout_s)
        self._writer.join(timeout_s)


class ServerProcess:
    """A running server tree. `kill_all` and `signal_group` are safe from any thread."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        pump: OutputPump,
        proc: ProcReader,
        run_id: str,
    ) -> None:
        self._popen = popen
        self.pump = pump
        self.proc = proc
        self.run_id = run_id
        self.pid = popen.pid
        self.pgid = popen.pid  # start_new_session: the server leads its own session and group
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(self.pid)
        self._lock = threading.Lock()
        self._known: set[int] = {self.pid}
        self._kill_reason: KillReason | None = None

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        run_id: str,
        sink: Callable[[str], None],
        redact: Callable[[str], str],
        oom_score_adj: int | None = 500,
        tail_lines: int = 200,
        proc: ProcReader | None = None,
    ) -> ServerProcess:
        """Launch `argv`. Call from the main thread: PDEATHSIG fires when the creating *thread*
        exits, not the process.

        Raises:
            OSError: the command cannot be executed (FileNotFoundError, PermissionError, ...).
        """
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_child_setup(os.getpid(), oom_score_adj),
        )
        assert popen.stdout is not None  # stdout=PIPE
        pump = OutputPump(popen.stdout, sink, redact, tail_lines=tail_lines)
        pump.start()
        return cls(popen, pump, proc or ProcReader(), run_id)

    # -- reading -----------------------------------------------------------------------------

    def poll(self) -> ExitStatus | None:
        """The main process's exit status once it has exited (and been reaped), else None."""
        returncode = self._popen.poll()
        return None if returncode is None else ExitStatus.from_returncode(returncode)

    def tree(self) -> tuple[ProcessInfo, ...]:
        """Every process of the tree now (group, descendants, escapees reparented to us)."""
        with self._lock:
            known = set(self._known)
        found = self.proc.server_tree(
            server_pid=self.pid,
            pgid=self.pgid,
            subreaper_pid=os.getpid(),
            run_id=self.run_id,
            known_pids=known,
        )
        with self._lock:
            self._known.update(p.pid for p in found)
        return found

    def refresh(self, known: Sequence[ProcessInfo]) -> tuple[ProcessInfo, ...]:
        """The known processes re-read from /proc/PID/status (no scan of the whole host)."""
        return self.proc.refresh(known)

    def tail(self) -> tuple[str, ...]:
        return self.pump.tail()

    @property
    def output_lines(self) -> int:
        return self.pump.lines

    @property
    def kill_reason(self) -> KillReason | None:
        with self._lock:
            return self._kill_reason

    def drain_output(self, timeout_s: float) -> None:
        self.pump.join(timeout_s)

    # -- acting ------------------------------------------------------------------------------

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the server's process group (a gone group is not an error)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def _record(self, reason: KillReason) -> None:
        """Keep the first reason: whoever acted first (watchdog or run loop) says why."""
        with self._lock:
            if self._kill_reason is None:
                self._kill_reason = reason

    def terminate(self, reason: KillReason) -> None:
        """Record `reason`, then SIGTERM the server's main process only.

        In SGLang only the main process handles SIGTERM (it answers 503, drains the requests in
        flight, then stops its children); the schedulers install no handler and would die at
        once, which its subprocess watchdog treats as a crash (tokenizer_manager.py
        `SignalHandler`, utils/watchdog.py). The whole group is killed only after a grace.
        """
        self._record(reason)
        # Popen checks the process is not yet reaped, so a recycled PID is never signalled.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self._popen.send_signal(signal.SIGTERM)

    def kill_all(self, reason: KillReason) -> tuple[int, ...]:
        """Record `reason`, SIGKILL the process group and every other process of the tree, then
        reap what is ours.

        Safe from any thread (the watchdog calls it in a memory emergency). Returns the PIDs
        found. Does not wait: see `remaining`.
        """
        self._record(reason)
        # Read the tree before the group dies: an escapee whose parent dies is reparented and
        # found only through the subreaper, which a test process (or a failed prctl) may not be.
        before = self.tree()
        self.signal_group(signal.SIGKILL)
        tree = {p.pid: p for p in (*before, *self.tree())}
        for p in tree.values():
            if not p.is_zombie:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p.pid, signal.SIGKILL)
        self.reap()
        return tuple(sorted(tree))

    def reap(self) -> None:
        """Collect exit statuses of the tree's processes that are our children.

        Not waitpid(-1): that would also steal the status of other children of the supervisor
        (an NVML worker, a reset command) and make their Popen report exit 0.
        """
        self._popen.poll()
        me = os.getpid()
        with self._lock:
            known = set(self._known)
        for info in self.proc.processes(known):
            if info.ppid == me and info.is_zombie and info.pid != self.pid:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(info.pid, os.WNOHANG)

    def remaining(self) -> tuple[ProcessInfo, ...]:
        """Processes of the tree still present, zombies of others included."""
        self.reap()
        return self.tree()

    def close(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


class SubprocessLauncher:
    """Implements core.ports.ServerLauncher: ServerProcess.start with this host's /proc."""

    def __init__(self, proc: ProcReader | None = None) -> None:
        self.proc = proc or ProcReader()

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        run_id: str,
        sink: Callable[[str], None],
        redact: Callable[[str], str],
        oom_score_adj: int | None,
        tail_lines: int,
    ) -> ServerProcess:
        return ServerProcess.start(
            argv,
            env,
            run_id=run_id,
            sink=sink,
            redact=redact,
            oom_score_adj=oom_score_adj,
            tail_lines=tail_lines,
            proc=self.proc,
        )
