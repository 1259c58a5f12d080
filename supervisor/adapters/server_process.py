"""Start the SGLang server in its own session, pump its output, signal and kill its whole tree.

Containment (docs/peers.md, killing a tree): `start_new_session` gives the tree one process
group; the supervisor is a child subreaper so escapees are reparented to it; the server asks for
SIGKILL when the supervisor dies (PR_SET_PDEATHSIG) and gets a raised oom_score_adj, inherited by
its children, and may run as another user (adapters/credentials.py). Its output goes through
adapters/output_pump.py. Implements core.ports.LaunchedServer and ServerLauncher.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from supervisor.adapters.cgroup import ServerCgroup
from supervisor.adapters.credentials import Credentials
from supervisor.adapters.output_pump import OutputPump
from supervisor.adapters.processes import (
    default_signal_dispositions,
    disown_child,
    own_child,
    spawning,
)
from supervisor.adapters.procfs import ProcReader
from supervisor.adapters.reclaim import process_mrelease
from supervisor.adapters.tree import ExitWatcher, TreeReader
from supervisor.core.events import KillReason
from supervisor.core.readings import ExitStatus, ProcessInfo

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)
# /proc mode: the whole host is scanned for members this often while the tree still changes
# (ranks spawning), then only when something hints at a new member (an unknown child reaped, a
# member exited) or this rarely. cgroup mode never scans: cgroup.procs is the membership.
SCAN_UNSETTLED_S = 1.0
SCAN_SETTLED_S = 30.0


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux >= 3.4): orphans of the tree come to us."""
    return bool(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _child_setup(
    parent_pid: int,
    oom_score_adj: int | None,
    cgroup_files: Sequence[str] = (),
    credentials: Credentials | None = None,
) -> Callable[[], None]:
    def setup() -> None:
        # Runs in the forked child before exec: only async-signal-safe-ish work, no logging.
        default_signal_dispositions()
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the supervisor died before the prctl: nobody to watch
            os._exit(1)
        # Enter the server's cgroup(s) before exec, so no descendant is ever born outside.
        for path in cgroup_files:
            with contextlib.suppress(OSError), open(path, "w") as f:
                f.write("0")
        if oom_score_adj is not None:
            with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(oom_score_adj))
        if credentials is not None:  # last: joining the cgroup needs root
            credentials.apply(parent_pid)

    return setup


class ServerProcess:
    """A running server tree. `kill_all`, `tree` and `refresh` are safe from any thread.

    Membership comes from the server's cgroup when it has one (every descendant, escapees
    included, at the cost of one read), else from /proc: the process group, its descendants, and
    the escapees reparented to this subreaper, found by a scan of the host.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        pump: OutputPump,
        proc: ProcReader,
        run_id: str,
        cgroup: ServerCgroup | None = None,
    ) -> None:
        self._popen = popen
        self.pump = pump
        self.proc = proc
        self.run_id = run_id
        self.pid = popen.pid
        self.pgid = popen.pid  # start_new_session: the server leads its own session and group
        self.reader = TreeReader(proc.root)
        self.cgroup = cgroup if cgroup is not None and self.pid in cgroup.pids() else None
        self.cgroup_missed = cgroup is not None and self.cgroup is None
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._kill_reason: KillReason | None = None
        self._scanned_at = float("-inf")
        self._scan_due = True
        self._settled = False
        self._watcher: ExitWatcher | None = None
        self._seen: dict[int, int] = {}  # every member seen alive: pid -> start ticks
        self.memory_released = 0
        self.reader.read([self.pid])  # opens the main process's files and pidfd at once

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
        cgroup: ServerCgroup | None = None,
        credentials: Credentials | None = None,
    ) -> ServerProcess:
        """Launch `argv` (inside `cgroup` when given). Call from the main thread: PDEATHSIG
        fires when the creating *thread* exits, not the process.

        Raises:
            OSError: the command cannot be executed (FileNotFoundError, PermissionError, ...).
        """
        files = cgroup.join_files if cgroup is not None else ()
        with spawning():  # its exit status classifies the death: never the orphan reaper's
            popen = subprocess.Popen(
                list(argv),
                env=credentials.environment(env) if credentials is not None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_child_setup(os.getpid(), oom_score_adj, files, credentials),
            )
            own_child(popen)
        assert popen.stdout is not None  # stdout=PIPE
        pump = OutputPump(popen.stdout, sink, redact, tail_lines=tail_lines)
        pump.start()
        return cls(popen, pump, proc or ProcReader(), run_id, cgroup)

    # -- reading -----------------------------------------------------------------------------

    def poll(self) -> ExitStatus | None:
        """The main process's exit status once it has exited (and been reaped), else None."""
        returncode = self._popen.poll()
        return None if returncode is None else ExitStatus.from_returncode(returncode)

    @property
    def mode(self) -> str:
        return self.cgroup.mode if self.cgroup is not None else "/proc"

    def tree(self) -> tuple[ProcessInfo, ...]:
        """Every process of the tree now, zombies included."""
        return self._note(self.reader.read(self._members(), titles=True))

    def refresh(self, known: Sequence[ProcessInfo]) -> tuple[ProcessInfo, ...]:
        """The known processes re-read through their open files; vanished ones left out."""
        return self._note(self.reader.read(p.pid for p in known))

    def _note(self, infos: tuple[ProcessInfo, ...]) -> tuple[ProcessInfo, ...]:
        self._seen.update((p.pid, p.start_ticks) for p in infos if p.start_ticks)
        return infos

    def members_seen(self) -> Mapping[int, int]:
        return dict(self._seen)

    def charged_bytes(self) -> int | None:
        """anon + shmem of the whole tree from its cgroup; None in /proc mode."""
        return self.cgroup.charged_bytes() if self.cgroup is not None else None

    def oom_kill_count(self) -> int | None:
        """The kernel's OOM kills of the tree's processes (its cgroup's); None in /proc mode."""
        return self.cgroup.oom_kill_count() if self.cgroup is not None else None

    def mark_ready(self) -> None:
        """The tree is up: in /proc mode, one scan now (the ranks may be younger than the last
        one), then rarely."""
        self._scan_due = True
        self._settled = True

    def watch_exits(self, notify: Callable[[], None]) -> None:
        """Call `notify` (from a thread) whenever a process of the tree exits."""
        if self._watcher is not None:
            return
        watcher = ExitWatcher(lambda _pid: self._exited(notify))
        self._watcher = watcher
        self.reader.on_new_member = watcher.watch
        for pid, fd in self.reader.pidfds().items():
            watcher.watch(pid, fd)

    def _exited(self, notify: Callable[[], None]) -> None:
        self._scan_due = True  # its children may have been reparented to us
        notify()

    def _members(self) -> set[int]:
        known = self.reader.known() | {self.pid}  # zombies leave cgroup.procs: keep them
        if self.cgroup is not None:
            return set(self.cgroup.pids()) | known
        with self._scan_lock:
            return self._scanned_members(known)

    def _scanned_members(self, known: set[int]) -> set[int]:
        now = time.monotonic()
        every_s = SCAN_SETTLED_S if self._settled else SCAN_UNSETTLED_S
        if not self._scan_due and now - self._scanned_at < every_s:
            return known
        found = frozenset(
            self.proc.server_tree_pids(
                server_pid=self.pid,
                pgid=self.pgid,
                subreaper_pid=os.getpid(),
                run_id=self.run_id,
                known_pids=known,
            )
        )
        self._scan_due = False
        self._scanned_at = now
        return set(found) | known

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
        """Record `reason`, SIGKILL the whole tree at once, hand its memory back, reap.

        cgroup mode: one `cgroup.kill`. /proc mode: the process group and every known member
        through its pidfd first, so the kill costs the same on a busy host, and only then a scan
        for escapees. process_mrelease follows each SIGKILL at once (later, the process is gone
        and there is nothing left to hurry). Safe from any thread; does not wait: see `remaining`.
        """
        self._record(reason)
        pidfds = self.reader.pidfds()
        if self.cgroup is not None:
            try:
                self.cgroup.kill()
            except Exception:  # noqa: BLE001 - the group vanished: fall back to signals below
                self.cgroup = None
        if self.cgroup is None:
            self.signal_group(signal.SIGKILL)
            for fd in pidfds.values():
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
        self.memory_released += sum(1 for fd in pidfds.values() if process_mrelease(fd))
        if self.cgroup is None:
            self._scan_due = True
            escapees = self._members() - set(pidfds)
            for pid in escapees:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.reap()
        return tuple(sorted(set(pidfds) | (set(self.cgroup.pids()) if self.cgroup else set())))

    def reap(self) -> None:
        """Collect exit statuses of the tree's processes that are our children. Not waitpid(-1):
        that would steal the status of the supervisor's other children (an NVML worker)."""
        self._popen.poll()
        me = os.getpid()
        for info in self.reader.read(self.reader.known()):
            if info.ppid == me and info.is_zombie and info.pid != self.pid:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(info.pid, os.WNOHANG)

    def remaining(self) -> tuple[ProcessInfo, ...]:
        """Processes of the tree still present, zombies of others included."""
        self.reap()
        self._scan_due = True
        return self.tree()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self.reader.close()
        if self._popen.poll() is not None:
            disown_child(self.pid)  # reaped: its PID may be someone else's from now on


class SubprocessLauncher:
    """Implements core.ports.ServerLauncher: ServerProcess.start with this host's /proc."""

    def __init__(
        self,
        proc: ProcReader | None = None,
        cgroup: ServerCgroup | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.proc = proc or ProcReader()
        self.cgroup = cgroup
        self.credentials = credentials  # who the server runs as; None: as the supervisor

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
            cgroup=self.cgroup,
            credentials=self.credentials,
        )
