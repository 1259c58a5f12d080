"""Run an operator's command (a hook, a GPU reset command) contained and bounded: nothing it
starts outlives it, what it prints cannot grow without bound, and no read of it ever blocks.

Containment, per command: a session and process group of its own; a mark in its environment
that every descendant inherits, setsid'd and double-forked ones included (HELPER_ENV =
"<supervisor pid>:<start ticks>/<n>", beside the instance's markers, so that a helper left by a
SIGKILLed supervisor is one of the instance's leftovers at its next start: core.ownership); and,
where the supervisor has its instance's cgroups (run/containment.py), a cgroup leaf of its own,
`P/sglang-supervisor.<instance>/helpers/<n>`, entered before exec: no descendant is ever born
outside it.

A command ends when its main process exits, at its timeout, or at `kill` (the supervisor is
stopping). Whatever is left of it then is SIGKILLed, as systemd's KillMode=control-group does
when a oneshot's command ends: the leaf in one write (`cgroup.kill`), else the process group and
every process carrying the command's mark, scanned until a scan finds none. A hook's `setsid`
child, or a reset script's background job, dies with it. (In `run` the supervisor is a child
subreaper: escapees come back to it, and those killed here are reaped here.)

Output: stdout and stderr share one pipe, read with poll() beside a pidfd of the main process,
and only the last `output_bytes` are kept. Once the main process is gone and the rest killed,
the pipe gets DRAIN_S to reach its end: a writer that escaped both the group and the mark (it
cleared its environment; /proc mode only) never holds the caller. A main process that SIGKILL
does not end (D state: `nvidia-smi -r` stuck in the driver) is waited for KILL_WAIT_S, then left
to the orphan reaper, and its leaf to run/containment.py's release.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from supervisor.adapters.cgroup import Cgroup, CgroupError
from supervisor.adapters.processes import (
    default_signal_dispositions,
    disown_child,
    own_child,
    spawning,
)
from supervisor.adapters.procfs import INSTANCE_ENV, SUPERVISOR_ENV, ProcReader
from supervisor.adapters.reclaim import KILL_WAIT_S, kill_marked, open_pidfd

log = structlog.get_logger("supervisor.command")

HELPER_ENV = "SGLANG_SUPERVISOR_HELPER"
# systemd's variables are the supervisor's alone (NotifyAccess=main).
SYSTEMD_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
DRAIN_S = 1.0  # after the command's end, how long its pipe may stay open
# How much longer than its timeout a command's `wait` may take: the kills, the main process's
# end, the drain.
WAIT_SLACK_S = 2 * KILL_WAIT_S + DRAIN_S
_READ_BYTES = 65536
_NO_PIDFD_SLICE_S = 0.05  # without pidfds (Linux < 5.3) the main process is polled this often


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandResult:
    """How one command ended."""

    returncode: int | None = None  # its main process's exit status (-N: signal N); None: none
    output: str = ""  # the end of what it printed, stdout and stderr together
    output_cut_bytes: int = 0  # what it printed before that end, not kept
    timed_out: bool = False  # killed at its timeout
    killed: bool = False  # killed by `kill` (the supervisor is stopping)
    error: str = ""  # it could not be started: the OS's reason
    left_pids: tuple[int, ...] = ()  # processes it left running, killed when it ended

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (self.timed_out or self.killed or self.error)


class _Tail:
    """The last `cap` bytes of a stream, and how many came before them."""

    def __init__(self, cap: int) -> None:
        self.cap, self.data, self.cut = max(0, cap), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        over = len(self.data) - self.cap
        if over > 0:
            del self.data[:over]
            self.cut += over


class CommandRunner:
    """Starts contained commands for one supervisor, from any thread; `close` at its exit.

    `helpers_dir`: the instance's `helpers` cgroup (None: /proc mode, the group and the mark).
    `instance`: the instance's name, for the markers the next start's leftover cleanup reads.
    """

    def __init__(
        self,
        *,
        helpers_dir: Path | None = None,
        instance: str | None = None,
        proc: ProcReader | None = None,
    ) -> None:
        self.helpers_dir = helpers_dir
        self.instance = instance
        self.proc = proc or ProcReader()
        self.mark = self.proc.supervisor_mark()
        self._count = itertools.count(1)
        self._lock = threading.Condition()
        self._running: set[RunningCommand] = set()
        self._closed = False

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        output_bytes: int,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Start `argv` and wait for its end (bounded by `timeout_s` + the kill and drain)."""
        return self.start(argv, timeout_s=timeout_s, output_bytes=output_bytes, env=env).wait()

    def start(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        output_bytes: int,
        env: Mapping[str, str] | None = None,
    ) -> RunningCommand:
        """Start `argv` (no shell) with `env` (default: this process's) less systemd's
        variables; `wait` on the result. After `close`, it is refused, never started."""
        with self._lock:
            number = next(self._count)
            command = RunningCommand(self, argv, f"{self.mark}/{number}", timeout_s, output_bytes)
            if self._closed:
                command.error = "not started: the supervisor is stopping"
                return command
            command.spawn(self._environment(env, command.tag), self._leaf(number))
            if command.popen is not None:
                self._running.add(command)
        return command

    def close(self) -> tuple[int, ...]:
        """Kill every command still running and refuse new ones; in /proc mode also every
        process carrying this supervisor's mark. Returns the PIDs killed by the sweep."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for command in running:
            command.kill()
        with self._lock:  # their own `wait` reaps them and removes their leaves
            self._lock.wait_for(lambda: not self._running, timeout=KILL_WAIT_S + DRAIN_S)
        prefix = f"{self.mark}/"
        return kill_marked(self.proc, HELPER_ENV, lambda value: value.startswith(prefix))

    def finished(self, command: RunningCommand) -> None:
        """Called by the command's `wait` once it is reaped and its leaf removed."""
        with self._lock:
            self._running.discard(command)
            self._lock.notify_all()

    def _environment(self, env: Mapping[str, str] | None, tag: str) -> dict[str, str]:
        base = os.environ if env is None else env
        out = {k: v for k, v in base.items() if k not in SYSTEMD_ENV}
        out[HELPER_ENV] = tag
        if self.instance is not None:
            out[INSTANCE_ENV] = self.instance
            out[SUPERVISOR_ENV] = self.mark
        return out

    def _leaf(self, number: int) -> Cgroup | None:
        if self.helpers_dir is None:
            return None
        leaf = self.helpers_dir / str(number)
        try:
            leaf.mkdir()
        except OSError as exc:
            log.warning("helper_cgroup_unavailable", group=str(leaf), reason=exc.strerror)
            return None
        return Cgroup(leaf)


class RunningCommand:
    """One started command: `wait` (one thread) for its end, `kill` (any thread) to end it."""

    def __init__(
        self,
        runner: CommandRunner,
        argv: Sequence[str],
        tag: str,
        timeout_s: float,
        output_bytes: int,
    ) -> None:
        self.runner = runner
        self.argv = tuple(argv)
        self.tag = tag
        self.popen: subprocess.Popen[bytes] | None = None
        self.error = ""
        self._deadline = time.monotonic() + max(0.0, timeout_s)
        self._tail = _Tail(output_bytes)
        self._leaf: Cgroup | None = None
        self._pidfd: int | None = None
        self._killed = False

    def spawn(self, env: Mapping[str, str], leaf: Cgroup | None) -> None:
        join_fd = _open_join(leaf)
        try:
            try:
                self.popen = self._popen(env, join_fd)
                self._leaf = leaf if join_fd is not None else None
            except subprocess.SubprocessError:  # the kernel refused the child its leaf
                group = str(leaf.group) if leaf is not None else ""
                log.warning("helper_cgroup_unavailable", group=group, reason="cannot enter it")
                self.popen = self._popen(env, None)  # the group and the mark still find it all
        except OSError as exc:
            self.error = exc.strerror or str(exc)
        finally:
            if join_fd is not None:
                os.close(join_fd)
            if self._leaf is None:
                _remove(leaf)
        if self.popen is not None:
            self._pidfd = open_pidfd(self.popen.pid)

    def _popen(self, env: Mapping[str, str], join_fd: int | None) -> subprocess.Popen[bytes]:
        with spawning():  # its exit status is its own, never the orphan reaper's
            popen = subprocess.Popen(  # the operator's command, run without a shell
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
                close_fds=True,
                preexec_fn=_joiner(join_fd) if join_fd is not None else default_signal_dispositions,
            )
            own_child(popen)
        return popen

    def kill(self) -> None:
        """End it now with all it started (the supervisor is stopping); `wait` then returns."""
        self._killed = True
        if self.popen is not None:
            self._kill_all()

    def wait(self) -> CommandResult:
        """Read its output until its main process exits or its timeout; kill what is left."""
        popen = self.popen
        if popen is None:
            return CommandResult(error=self.error)
        assert popen.stdout is not None  # stdout=PIPE
        out_fd = popen.stdout.fileno()
        try:
            in_time = self._read(out_fd, self._deadline, until_exit=True)
            left = self._kill_all()
            exited = self._await_main(0.0 if in_time else KILL_WAIT_S)
            self._read(out_fd, time.monotonic() + DRAIN_S, until_exit=False)
        finally:
            self._close()
        return CommandResult(
            returncode=popen.returncode if exited else None,
            output=self._tail.data.decode(errors="replace"),
            output_cut_bytes=self._tail.cut,
            timed_out=not in_time and not self._killed,
            killed=self._killed,
            left_pids=tuple(p for p in left if p != popen.pid),
        )

    def _read(self, out_fd: int, deadline: float, *, until_exit: bool) -> bool:
        """poll() the pipe (and the pidfd when `until_exit`) until the deadline; True when the
        main process exited (`until_exit`) or the pipe reached its end."""
        poller = select.poll()
        poller.register(out_fd, select.POLLIN)
        if until_exit and self._pidfd is not None:
            poller.register(self._pidfd, select.POLLIN)
        while (left := deadline - time.monotonic()) > 0:
            if until_exit and self._pidfd is None:
                left = min(left, _NO_PIDFD_SLICE_S)
            for fd, _ in poller.poll(left * 1000):
                if fd == self._pidfd:
                    return True
                chunk = os.read(out_fd, _READ_BYTES)
                if chunk:
                    self._tail.add(chunk)
                elif not until_exit:
                    return True
                else:  # the pipe is closed, the process may run on: wait for its exit only
                    poller.unregister(out_fd)
            if until_exit and self._pidfd is None and self.popen and self.popen.poll() is not None:
                return True
        return False

    def _await_main(self, timeout_s: float) -> bool:
        """Reap the main process (exited, or SIGKILLed: given `timeout_s` to be gone)."""
        assert self.popen is not None
        try:
            self.popen.wait(timeout=timeout_s if timeout_s > 0 else None)
        except subprocess.TimeoutExpired:
            log.warning("helper_unkillable", pid=self.popen.pid, command=self.argv[0])
            return False  # D state: the orphan reaper collects it through its Popen later
        return True

    def _kill_all(self) -> tuple[int, ...]:
        """SIGKILL every process of the command still alive; returns the PIDs found."""
        assert self.popen is not None
        if self._leaf is not None:
            found = tuple(self._leaf.pids())
            if found:
                with contextlib.suppress(CgroupError):
                    self._leaf.kill()
                self._leaf.wait_empty(KILL_WAIT_S)
            return found
        found = kill_marked(self.runner.proc, HELPER_ENV, lambda value: value == self.tag)
        with spawning():  # no reap in between: the group's ID is still the main process's
            if self.popen.returncode is None:  # the group's members that cleared the mark
                with contextlib.suppress(OSError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
        return found

    def _close(self) -> None:
        assert self.popen is not None
        if self.popen.returncode is not None:
            disown_child(self.popen.pid)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        _remove(self._leaf)
        self.runner.finished(self)


def _open_join(leaf: Cgroup | None) -> int | None:
    """The leaf's cgroup.procs, opened here: the child only writes to it before exec."""
    if leaf is None:
        return None
    try:
        return os.open(leaf.group / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _joiner(fd: int) -> Callable[[], None]:
    def join() -> None:
        # In the forked child: signal resets and one write, nothing that could take a lock
        # another thread held.
        # A refusal raises: Popen then fails with SubprocessError before anything was exec'd.
        default_signal_dispositions()
        os.write(fd, b"0")

    return join


def _remove(leaf: Cgroup | None) -> None:
    if leaf is not None:
        with contextlib.suppress(CgroupError):  # still populated (D state): release() retries
            leaf.remove()
