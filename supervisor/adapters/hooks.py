"""Notification hooks: the operator's commands for `ready`, `fatal` and `incident_written`
events (earlyoom's -N), run without a shell on a worker thread, each contained by
adapters/command.py: in a session and (where the host allows) a cgroup of its own, killed whole
at its timeout, and nothing it started outlives it (a `setsid` child included).

`HookRunner.sink` is a log tap (supervisor/log.add_sink): it is called synchronously by every
thread that logs, so it only decides (core/hooks.py) and queues; it never logs, and never waits.
The worker logs `hook_done` or `hook_failed` (its own events call no hook). Values reach the log
after masking, so a secret in a hook's argv or output is masked there.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from supervisor.adapters.command import WAIT_SLACK_S, CommandRunner
from supervisor.core.hooks import HookCall, hook_call
from supervisor.core.redact import redact_command
from supervisor.errors import ExitCode

log = structlog.get_logger("supervisor.hooks")

_OUTPUT_CHARS = 2000  # of a hook's output, the end goes into the log
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
        self,
        commands: Mapping[str, Sequence[str]],
        *,
        instance: str,
        timeout_s: float,
        launcher: CommandRunner | None = None,
    ) -> None:
        self.commands: Mapping[str, Sequence[str]] = dict(commands)
        self.instance = instance
        self.timeout_s = timeout_s
        self.launcher = launcher or CommandRunner()
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
            bound_s = (self._pending + 1) * (self.timeout_s + WAIT_SLACK_S)
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
        # The launcher leaves systemd's variables out: they are the supervisor's alone
        # (NotifyAccess=main).
        env = {**os.environ, EVENT_ENV: event_json}
        shown = redact_command(call.argv)  # its output is masked with the log's secrets
        timeout_s = self.timeout_s
        done = self.launcher.run(
            call.argv, timeout_s=timeout_s, output_bytes=4 * _OUTPUT_CHARS, env=env
        )
        if done.error:
            log.error("hook_failed", hook=call.hook, command=shown, error=done.error)
            return
        fields: dict[str, Any] = {"output": done.output[-_OUTPUT_CHARS:]}
        if done.left_pids:  # what it left running, killed when it ended
            fields["killed_pids"] = list(done.left_pids)
        if done.timed_out or done.killed:
            why = f"timed out after {timeout_s:g} s" if done.timed_out else "the supervisor stopped"
            error = f"{why} (killed)"
            log.error("hook_failed", hook=call.hook, command=shown, error=error, **fields)
        elif done.returncode != 0:
            log.error(
                "hook_failed", hook=call.hook, command=shown, exit_code=done.returncode, **fields
            )
        else:
            log.info("hook_done", hook=call.hook, command=shown, **fields)
