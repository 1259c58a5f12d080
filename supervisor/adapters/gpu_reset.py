"""Run the configured GPU reset command for one GPU or one NVLink peer set: template with
{index}, {uuid} and {indices}, split like a shell would but run without one, with a timeout.
Implements ports.GpuResetter; whether a reset may run at all is core.gpu_repair's decision.

Each reset is contained by adapters/command.py (a session, a mark and, where the host allows, a
cgroup leaf of its own): at its timeout the command is killed with everything it started, a
`setsid` child included, and the supervisor's cgroups stay removable. Resets of several GPUs
run at once from worker threads (run/gpu_repair.py); `close` ends those still running when the
supervisor stops.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Mapping, Sequence

from supervisor.adapters.command import CommandRunner, RunningCommand
from supervisor.core.gpu_release import ResetOutcome
from supervisor.core.gpu_repair import reset_words
from supervisor.core.redact import redact_command, redact_line

_OUTPUT_CHARS = 500  # enough for nvidia-smi's one-line verdict, bounded for logs and incidents


def reset_argv(template: str, index: int, uuid: str, indices: Sequence[int] = ()) -> list[str]:
    """The command for one GPU (`indices`: its whole peer set), each word formatted on its own."""
    return reset_words(template, index, uuid, indices)


def check_reset_command(template: str) -> str | None:
    """Why the reset command cannot run (missing or not executable), None when it looks fine."""
    if not template:
        return None
    program = reset_argv(template, 0, "GPU-0")[0]
    if os.sep in program:
        if not os.path.isfile(program):
            return f"gpu reset_command {program!r} does not exist"
        if not os.access(program, os.X_OK):
            return f"gpu reset_command {program!r} is not executable"
        return None
    if shutil.which(program) is None:
        return f"gpu reset_command {program!r} not found on PATH"
    return None


class CommandGpuResetter:
    """Runs `template` per GPU or peer set; exit 0 within `timeout_s` is success. Safe to call
    from several threads at once."""

    def __init__(
        self,
        template: str,
        *,
        timeout_s: float = 120.0,
        env: Mapping[str, str] | None = None,
        launcher: CommandRunner | None = None,
    ) -> None:
        self.template = template
        self.timeout_s = timeout_s
        self.env = dict(env) if env is not None else None
        self.launcher = launcher or CommandRunner()
        self._lock = threading.Lock()
        self._running: set[RunningCommand] = set()
        self._closed = False

    def reset(self, index: int, uuid: str, indices: Sequence[int] = ()) -> ResetOutcome:
        argv = reset_argv(self.template, index, uuid, indices)
        shown = redact_command(argv)  # a hypervisor hook may carry a token
        with self._lock:
            if self._closed:
                return ResetOutcome(ok=False, detail=f"{shown} not run: the supervisor is stopping")
            command = self.launcher.start(
                argv, timeout_s=self.timeout_s, output_bytes=4 * _OUTPUT_CHARS, env=self.env
            )
            self._running.add(command)
        try:
            done = command.wait()
        finally:
            with self._lock:
                self._running.discard(command)
        if done.error:
            return ResetOutcome(ok=False, detail=f"{shown}: {done.error}")
        if done.timed_out:
            return ResetOutcome(ok=False, detail=f"{shown} timed out after {self.timeout_s:g} s")
        if done.killed:
            return ResetOutcome(ok=False, detail=f"{shown} killed: the supervisor is stopping")
        output = redact_line(done.output.strip()[-_OUTPUT_CHARS:])
        if done.returncode != 0:
            return ResetOutcome(
                ok=False,
                detail=f"{shown} exited {done.returncode}: {output}",
            )
        return ResetOutcome(ok=True, detail=output)

    def close(self) -> None:
        """Kill the resets running now, with all they started, and run no more: the supervisor
        is stopping (their `reset` calls return a failed outcome at once)."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for command in running:
            command.kill()
