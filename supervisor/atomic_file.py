"""The supervisor's own files: written atomically (a reader, or a crash, sees the old file or the
new one, never half of it), and read from regular files only (a FIFO put where a state or config
file belongs would block the read for ever, a device may never end)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import BinaryIO


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, fsync it, rename it over `path`, fsync the dir.

    Raises:
        OSError: the directory is missing, full or not writable; `path` is then unchanged.
    """
    import tempfile  # only writers need it: the pre-flight reads files and must start fast

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename itself must reach the disk, or a power cut can bring the old file back.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class NotRegularFile(OSError):
    """A path that names a FIFO, a directory, a device or a socket where a file belongs."""


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
        raise NotRegularFile(f"not a regular file ({kind})")


def open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading, a regular file only. Checked before the open, and again on the
    descriptor, opened without blocking, in case the path changed in between.

    Raises:
        NotRegularFile: a FIFO, directory, device or socket (its kind in the message).
        OSError: missing or unreadable.
    """
    _check_regular(os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check_regular(os.fstat(fd).st_mode)
    except NotRegularFile:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")
