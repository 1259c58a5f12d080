"""Notification hooks: the operator's commands for `ready`, `fatal` and `incident_written`
events (earlyoom's -N), run without a shell on a worker thread, each in a session of its own
that is SIGKILLed whole at its timeout.

`HookRunner.sink` is a log tap (supervisor/log.add_sink): it is called synchronously by every
thread that logs, so it only decides (core/hooks.py) and queues; it never logs, and never waits.
The worker logs `hook_done` or `hook_failed` (its own events call no hook). Values reach the log
after masking, so a secret in a hook's argv or output is masked there.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from supervisor.core.hooks import HookCall, hook_call
from supervisor.core.redact import redact_command
from supervisor.errors import ExitCode

log = structlog.get_logger("supervisor.hooks")

_OUTPUT_CHARS = 2000  # of a hook's output, the end goes into the log
# systemd's variables are the supervisor's alone (NotifyAccess=main).
_DROPPED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
EVENT_ENV = "SGLANG_SUPERVISOR_EVENT"  # the event that called the hook, as JSON
_EXIT_NAMES = {int(code): code.name.lower() for code in ExitCode}


def command_problem(name: str, argv: Sequence[str]) -> str | None:
    """Why the hook's program cannot run (missing, not executable), or None."""
    if not argv:
        return None
    program = argv[0]
    if os.sep in program:
        if not os.path.isfile(program) or not os.access(program, os.X_OK):
            return f"config key hooks.{name}: {program!r} is not an executable file"
        return None
    if shutil.which(program) is None:
        return f"config key hooks.{name}: {program!r} not found on PATH"
    return None


class HookRunner:
    """Runs the hooks one after another on a daemon thread; `close` waits for those queued."""

    def __init__(
        self, commands: Mapping[str, Sequence[str]], *, instance: str, timeout_s: float
    ) -> None:
        self.commands: Mapping[str, Sequence[str]] = dict(commands)
        self.instance = instance
        self.timeout_s = timeout_s
        self._queue: queue.SimpleQueue[tuple[HookCall, str] | None] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._work, name="hooks", daemon=True)
        self._thread.start()

    def configure(self, commands: Mapping[str, Sequence[str]], timeout_s: float) -> None:
        """New commands and timeout (a reload): they apply from the next event."""
        self.commands, self.timeout_s = dict(commands), timeout_s

    def sink(self, event: Mapping[str, Any]) -> None:
        """The log tap: queue the hook `event` calls, if any (quick, never logs)."""
        call = hook_call(event, self.commands, self.instance, _EXIT_NAMES)
        if call is None:
            return
        with self._idle:
            self._pending += 1
        self._queue.put((call, json.dumps(dict(event), default=str)))

    def close(self) -> None:
        """Wait for the queued hooks (each bounded by its timeout), then stop the thread."""
        with self._idle:
            bound_s = (self._pending + 1) * (self.timeout_s + 1.0)
            self._idle.wait_for(lambda: self._pending == 0, timeout=bound_s)
        self._queue.put(None)
        self._thread.join(1.0)

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._run(*job)
            except Exception:  # the thread must outlive a hook's bug; logged with traceback
                log.exception("hook_failed", hook=job[0].hook)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _run(self, call: HookCall, event_json: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env[EVENT_ENV] = event_json
        shown = redact_command(call.argv)  # its output is masked with the log's secrets
        timeout_s = self.timeout_s
        try:
            proc = subprocess.Popen(  # the operator's command, run without a shell
                call.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own group: a timeout kills its children too
            )
        except OSError as exc:
            log.error("hook_failed", hook=call.hook, command=shown, error=exc.strerror or str(exc))
            return
        try:
            raw, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                raw, _ = proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:  # a descendant in a session of its own holds it
                proc.kill()
                proc.wait()
                raw = b""
            output = raw.decode(errors="replace")[-_OUTPUT_CHARS:]
            log.error(
                "hook_failed",
                hook=call.hook,
                command=shown,
                error=f"timed out after {timeout_s:g} s (killed)",
                output=output,
            )
            return
        output = raw.decode(errors="replace")[-_OUTPUT_CHARS:]
        if proc.returncode != 0:
            log.error(
                "hook_failed",
                hook=call.hook,
                command=shown,
                exit_code=proc.returncode,
                output=output,
            )
            return
        log.info("hook_done", hook=call.hook, command=shown, output=output)
