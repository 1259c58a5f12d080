"""The SGLang version installed for the server's interpreter, from package metadata only.

Never imports sglang: for another interpreter it runs `python -c importlib.metadata.version(...)`
in a subprocess (a few tens of ms), for this one it reads the metadata in-process.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    pass\n"
)
_TIMEOUT_S = 10.0


def interpreter_for(command: Sequence[str]) -> str | None:
    """The Python interpreter a server command runs: `[python, -m, ...]` or a console script.

    Returns None when it cannot be told (the caller then applies the newest rules).
    """
    if not command:
        return sys.executable
    first = command[0]
    exe = first if "/" in first else shutil.which(first)
    if exe is None:
        return None
    name = Path(exe).name
    if name.startswith("python"):
        return exe
    try:  # a console script such as `sglang`: its shebang names the interpreter
        with open(exe, "rb") as fh:
            head = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if head.startswith("#!"):
        parts = head[2:].split()
        if parts and Path(parts[0]).name.startswith("python"):
            return parts[0]
    return None


def installed_sglang_version(interpreter: str | None) -> str | None:
    """SGLang's version for `interpreter` (None: this one), or None when not installed/unknown."""
    if interpreter is None or Path(interpreter).resolve() == Path(sys.executable).resolve():
        try:
            return importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            return None
    try:
        done = subprocess.run(
            [interpreter, "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = done.stdout.strip()
    return version or None
