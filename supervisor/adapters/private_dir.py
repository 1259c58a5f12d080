"""Make (or accept) a directory for root's own files: the state directory.

The path is walked from `/` one component at a time with lstat, each symbolic link followed by
hand (readlink), and every component judged by core.private_dir. A missing directory is created
(the state directory 0700, those above it 0755) and then judged like one that was there, so a
directory someone else made first in a sticky /tmp, between our look and our mkdir, is refused
rather than used.

Decided here, documented in docs/faults.md ("State and files"):
- a symbolic link on the path is followed when root or we own it, and the state directory is
  then the link's target, judged by the same rule;
- a link whose target does not exist is refused, not created through: a path that names a link
  means the target to be there;
- a loop of links, or a regular file on the path: refused, saying which; a component that
  cannot be read or made (EACCES, EROFS) is the caller's OSError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import stat
from pathlib import Path

from supervisor.core.private_dir import (
    MAX_LINKS,
    PARENT_DIR_MODE,
    STATE_DIR_MODE,
    Entry,
    Role,
    problem,
)


class UnsafeDirectory(Exception):
    """The directory cannot be used; the message says why, the path named by the caller."""


def _refuse_if_unsafe(path: Path, st: os.stat_result, role: Role, euid: int) -> None:
    entry = Entry(
        path=str(path), uid=st.st_uid, owner=str(st.st_uid), mode=stat.S_IMODE(st.st_mode)
    )
    if problem(entry, role, euid) is None:
        return
    # The owner's name only for the message: a lookup may ask a directory service.
    with contextlib.suppress(KeyError):
        entry = dataclasses.replace(entry, owner=pwd.getpwuid(st.st_uid).pw_name)
    raise UnsafeDirectory(problem(entry, role, euid))


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a directory"


def _judge(path: Path, role: Role, euid: int) -> None:
    _refuse_if_unsafe(path, os.lstat(path), role, euid)


def private_dir(path: Path, euid: int | None = None) -> Path:
    """The directory `path` names, created if missing, links resolved; checked for `euid` (ours
    by default).

    Raises:
        UnsafeDirectory: another user could change what is in it, or it is not a directory.
        OSError: a directory on the way cannot be read or created (EACCES, EROFS, ENOSPC).
    """
    euid = os.geteuid() if euid is None else euid
    here = Path("/")
    # (component, the link it came from: None for the path's own); consumed from the front.
    pending: list[tuple[str, Path | None]] = [(p, None) for p in path.absolute().parts[1:]]
    links = 0
    while pending:
        name, via = pending.pop(0)
        if name == "..":
            here = here.parent  # `here` holds no link: its lexical parent is the real one
            continue
        _judge(here, Role.ABOVE, euid)
        step = here / name
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            if via is not None:
                raise UnsafeDirectory(
                    f"is a symbolic link ({via} -> {os.readlink(via)}) to a directory that "
                    "does not exist; create the target or remove the link"
                ) from None
            with contextlib.suppress(FileExistsError):  # made meanwhile: judged like any
                os.mkdir(step, PARENT_DIR_MODE if pending else STATE_DIR_MODE)
            pending.insert(0, (name, None))  # judged next, like one that was there
            continue
        if stat.S_ISLNK(st.st_mode):
            links += 1
            here, more = _follow(here, step, st, links, euid)
            pending[:0] = [(p, step) for p in more]
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeDirectory(_not_a_directory(step, st, last=not pending and via is None))
        here = step
    _judge(here, Role.STATE_DIR, euid)
    return here


def _follow(
    here: Path, link: Path, st: os.stat_result, count: int, euid: int
) -> tuple[Path, tuple[str, ...]]:
    """(where the link's target is walked from, the target's components)."""
    if count > MAX_LINKS:
        raise UnsafeDirectory(f"is a loop of symbolic links (more than {MAX_LINKS} followed)")
    _refuse_if_unsafe(link, st, Role.LINK, euid)
    target = Path(os.readlink(link))
    if target.is_absolute():
        return Path("/"), target.parts[1:]
    return here, target.parts


def _not_a_directory(step: Path, st: os.stat_result, *, last: bool) -> str:
    kind = _kind(st.st_mode)
    if last:
        return f"is {kind}, not a directory"
    return f"cannot be used: {step} on its path is {kind}, not a directory"
