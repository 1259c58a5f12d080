"""The supervisor's own files: written atomically (a reader, or a crash, sees the old file or the
new one, never half of it), and read from regular files only (a FIFO put where a state or config
file belongs would block the read for ever, a device may never end).

Root writes these files, so none of them may be turned against it by a symbolic link planted
where the file belongs: the writer creates its temp file with O_EXCL (mkstemp, which never
follows a link) and renames it over the final name, which replaces a link there instead of
writing through it; a reader of our own files (`follow_symlinks=False`) opens with O_NOFOLLOW
and refuses a link. Readers of files the operator names (a config file, a model directory, Hugging
Face's cache, made of links) follow them as the operator meant.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

# Files the supervisor creates are its own: 0600 (mkstemp's mode). A file another user must read
# (the node_exporter textfile; status.json by a group the operator chose) passes its mode.
PRIVATE_FILE_MODE = 0o600


def write_text_atomic(
    path: Path, text: str, mode: int = PRIVATE_FILE_MODE, *, sync: bool = True
) -> None:
    """Write `text` to a temp file beside `path`, fsync it, rename it over `path`, fsync the dir.

    The temp file is created 0600 and given `mode` before the rename. A symbolic link at `path`
    is replaced by the new file; its target is never opened.

    `sync=False` skips both fsyncs: the rename is still atomic and outlives this process (the
    page cache holds it), only a power cut may lose it. For a write that must not wait on the
    disk (the memory watchdog's, right before a kill); a synced write should follow.

    Raises:
        OSError: the directory is missing, full or not writable; `path` is then unchanged.
    """
    import tempfile  # only writers need it: the pre-flight reads files and must start fast

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if mode != PRIVATE_FILE_MODE:
                os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not sync:
        return
    # The rename itself must reach the disk, or a power cut can bring the old file back.
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class NotRegularFile(OSError):
    """A path that names a FIFO, a directory, a device, a socket or (for our own files) a symbolic
    link where a file belongs."""


_KINDS = (
    (stat.S_ISLNK, "a symbolic link, not followed"),
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


def open_regular(path: Path, *, follow_symlinks: bool = True) -> BinaryIO:
    """Open `path` for reading, a regular file only. Checked before the open, and again on the
    descriptor, opened without blocking, in case the path changed in between.

    `follow_symlinks=False` for the supervisor's own files: a symbolic link there is refused
    (NotRegularFile), and the open itself is O_NOFOLLOW, so a link put there after the check is
    refused too (ELOOP).

    Raises:
        NotRegularFile: a FIFO, directory, device, socket, or an unfollowed link (its kind in the
            message).
        OSError: missing or unreadable.
    """
    _check_regular((os.stat if follow_symlinks else os.lstat)(path).st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        _check_regular(os.fstat(fd).st_mode)
    except NotRegularFile:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")
