"""The SGLang version installed for the server's interpreter, from package metadata only.

Never imports sglang, nor importlib.metadata (~7 ms of imports with email's parser, for one
string): the version is the `Version:` header of the first `sglang-*.dist-info` (or `.egg-info`)
on the interpreter's sys.path, the distribution importlib.metadata.version("sglang") finds there.
For another interpreter this very file runs as a script under it (`python -I sglang_version.py`,
a few ms after its start-up), so both look the same way: keep the top level to the standard
library and to Python 3.8 syntax.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

_TIMEOUT_S = 10.0
_INFO_SUFFIXES = (".dist-info", ".egg-info")
# A dist-info holds METADATA; an egg-info directory PKG-INFO; "" reads an old egg-info *file*.
_METADATA_FILES = ("METADATA", "PKG-INFO", "")


def interpreter_for(command: Sequence[str]) -> str | None:
    """The Python interpreter a server command runs: `[python, -m, ...]` or a console script.

    Returns None when it cannot be told (the caller then applies the newest rules).
    """
    if not command:
        return sys.executable
    # Imported here, not at the top: the top level also runs as the probe script.
    import shutil
    from pathlib import Path

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
    from pathlib import Path  # not at the top: see the module docstring

    if interpreter is None or _same_environment(Path(interpreter), Path(sys.executable)):
        return sglang_version_on(sys.path)
    import subprocess  # only for another interpreter

    try:
        done = subprocess.run(
            [interpreter, "-I", os.path.abspath(__file__)],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = done.stdout.strip()
    return version or None


def _same_environment(a: Path, b: Path) -> bool:
    """Whether two interpreter paths see the same site-packages. Two venvs made from one base
    Python resolve to the same binary but are not the same environment: a venv is told by the
    pyvenv.cfg beside its bin/ directory, so only venv-less paths are compared resolved."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    in_venv = any((p.parent.parent / "pyvenv.cfg").exists() for p in (a, b))
    return not in_venv and a.resolve() == b.resolve()


def sglang_version_on(paths: Iterable[str]) -> str | None:
    """The version of the first SGLang distribution in `paths` (a sys.path), or None.

    In path order, as importlib.metadata searches; '' is the working directory. Zip entries are
    not looked into (SGLang is never installed as a zip).
    """
    for entry in paths:
        root = entry or "."
        try:
            names = sorted(os.listdir(root))
        except OSError:  # missing, not a directory, or unreadable: importlib skips it too
            continue
        for name in names:
            if _is_sglang_info(name):
                return _version_in(os.path.join(root, name))
    return None


def _is_sglang_info(name: str) -> bool:
    """`sglang-0.5.23.dist-info`, `sglang.egg-info`, `SGLang-0.5.egg-info`; not sglang_router."""
    low = name.lower()
    if not low.endswith(_INFO_SUFFIXES):
        return False
    # importlib.metadata's rule: the project is what precedes the first "-" of the stem.
    return low.rpartition(".")[0].partition("-")[0] == "sglang"


def _version_in(info: str) -> str | None:
    """The `Version:` header of a dist-info or egg-info (None: none, or unreadable)."""
    for name in _METADATA_FILES:
        try:
            with open(os.path.join(info, name) if name else info, encoding="utf-8") as fh:
                return _header_version(fh)
        except (IsADirectoryError, NotADirectoryError, FileNotFoundError):
            continue
        except (OSError, ValueError):  # unreadable or not UTF-8: unknown, the newest rules
            return None
    return None


def _header_version(lines: Iterable[str]) -> str | None:
    # Core metadata is an RFC 822 header block; the description after the first blank line may
    # quote other "Version:" lines, so reading stops there.
    for line in lines:
        if not line.strip():
            break
        key, colon, value = line.partition(":")
        if colon and key.strip().lower() == "version":
            return value.strip() or None
    return None


if __name__ == "__main__":  # the probe another interpreter runs (installed_sglang_version)
    print(sglang_version_on(sys.path) or "")
