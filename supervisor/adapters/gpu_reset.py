"""Run the configured GPU reset command for one GPU or one NVLink peer set: template with
{index}, {uuid} and {indices}, split like a shell would but run without one, with a timeout.
Implements ports.GpuResetter; whether a reset may run at all is core.gpu_repair's decision.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

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
    """Runs `template` per GPU or peer set; exit 0 within `timeout_s` is success."""

    def __init__(
        self, template: str, *, timeout_s: float = 120.0, env: Mapping[str, str] | None = None
    ) -> None:
        self.template = template
        self.timeout_s = timeout_s
        self.env = dict(env) if env is not None else None

    def reset(self, index: int, uuid: str, indices: Sequence[int] = ()) -> ResetOutcome:
        argv = reset_argv(self.template, index, uuid, indices)
        shown = redact_command(argv)  # a hypervisor hook may carry a token
        try:
            done = subprocess.run(  # operator-configured command, run without a shell
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
                env=self.env,
            )
        except subprocess.TimeoutExpired:
            return ResetOutcome(ok=False, detail=f"{shown} timed out after {self.timeout_s:g} s")
        except OSError as exc:
            return ResetOutcome(ok=False, detail=f"{shown}: {exc.strerror or exc}")
        output = redact_line((done.stdout + done.stderr).strip()[-_OUTPUT_CHARS:])
        if done.returncode != 0:
            return ResetOutcome(
                ok=False,
                detail=f"{shown} exited {done.returncode}: {output}",
            )
        return ResetOutcome(ok=True, detail=output)
