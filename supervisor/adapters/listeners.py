"""Who holds the server's port: the listening sockets of its network namespace and the sockets
its tree has open, read from /proc and judged by supervisor/core/listener.py.

Read only when a probe first answers 200 during startup (once per launch): the fd links of a
TP8 tree are a few thousand readlinks. The root is injectable so tests point it at a fake /proc.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from supervisor.core.listener import Listener, PortCheck, judge_port, parse_listeners

_SOCKET_LINK = "socket:["


def read_listeners(pid: int, proc: Path = Path("/proc")) -> tuple[Listener, ...] | None:
    """The listening TCP sockets of `pid`'s network namespace (None: neither table readable)."""
    found: list[Listener] = []
    readable = False
    for name in ("tcp", "tcp6"):  # tcp6 is absent on a kernel without IPv6
        try:
            text = (proc / str(pid) / "net" / name).read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        readable = True
        found.extend(parse_listeners(text))
    return tuple(found) if readable else None


def socket_inodes(pids: Iterable[int], proc: Path = Path("/proc")) -> frozenset[int]:
    """The inodes of the sockets these processes hold open (a vanished or unreadable one adds
    none)."""
    inodes: set[int] = set()
    for pid in pids:
        inodes.update(_sockets_of(proc / str(pid) / "fd"))
    return frozenset(inodes)


def _sockets_of(fd_dir: Path) -> set[int]:
    found: set[int] = set()
    try:
        entries = os.listdir(fd_dir)
    except OSError:
        return found
    for entry in entries:
        try:
            link = os.readlink(fd_dir / entry)
        except OSError:
            continue
        if link.startswith(_SOCKET_LINK) and link.endswith("]"):
            found.add(int(link[len(_SOCKET_LINK) : -1]))
    return found


def socket_holder(inode: int, proc: Path = Path("/proc")) -> int | None:
    """A process that holds socket `inode` open (None: none this user may look into)."""
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return None
    for pid in pids:
        if inode in _sockets_of(proc / str(pid) / "fd"):
            return pid
    return None


def check_port(
    main_pid: int, pids: Sequence[int], target: str, port: int, proc: Path = Path("/proc")
) -> PortCheck:
    """Judge whether `target`:`port` is answered by the tree of `pids` (main_pid among them)."""
    listeners = read_listeners(main_pid, proc)
    verdict = judge_port(listeners, socket_inodes({main_pid, *pids}, proc), target, port)
    holder = socket_holder(verdict.foreign[0].inode, proc) if verdict.foreign else None
    return PortCheck(verdict, holder)
