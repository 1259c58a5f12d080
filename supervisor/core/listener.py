"""Whose socket answers on the server's port: the server's tree, or someone else (pure).

A 200 on the health path says that *a* server answers there, not that it is ours. SGLang that
cannot bind its port ("address already in use") still runs its warm-up against whatever holds
the port, logs "The server is fired up and ready to roll!" if that answers, and only then exits
3 (entrypoints/http_server.py: the lifespan joins its warm-up thread, 0.5.23 lines 450-468;
uvicorn's STARTUP_FAILURE). So readiness also asks the kernel: the listening socket the probe
reaches must be one the tree holds open. The listening sockets come from /proc/PID/net/tcp and
tcp6 (the server's own network namespace), the tree's from its /proc/PID/fd links
`socket:[INODE]`; both are read by supervisor/adapters/listeners.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

_LISTEN = "0A"  # TCP_LISTEN in the `st` column


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening TCP socket: its local address (as text), port and inode."""

    address: str
    port: int
    inode: int


def _address(hex_text: str) -> str:
    """A /proc/net/tcp{,6} address: 32-bit words in the host's (little-endian) byte order."""
    raw = bytes.fromhex(hex_text)
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(swapped))


def parse_listeners(text: str) -> tuple[Listener, ...]:
    """The LISTEN rows of a /proc/net/tcp or /proc/net/tcp6 table (other rows, and rows that
    do not parse, are skipped)."""
    found: list[Listener] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        address, _, port_hex = fields[1].partition(":")
        try:
            found.append(Listener(_address(address), int(port_hex, 16), int(fields[9])))
        except ValueError:
            continue
    return tuple(found)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def reached(listeners: Iterable[Listener], target: str, port: int) -> tuple[Listener, ...]:
    """The sockets a connection to `target`:`port` lands on: those bound to that very address
    if any (the kernel prefers the most specific), else the wildcards. A target that is no IP
    address (a host name) may reach any of them."""
    on_port = [entry for entry in listeners if entry.port == port]
    wanted = _ip(target)
    if wanted is None:
        return tuple(on_port)
    exact: list[Listener] = []
    wildcard: list[Listener] = []
    for entry in on_port:
        address = _ip(entry.address)
        if address == wanted or (
            isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped == wanted
        ):
            exact.append(entry)
        elif address is not None and address.is_unspecified:
            wildcard.append(entry)
    return tuple(exact or wildcard)


class PortOwner(str, Enum):
    OURS = "ours"  # every socket the probe reaches is held by the tree
    FOREIGN = "foreign"  # one is not (or none listens where the probe went)
    UNKNOWN = "unknown"  # the tables could not be read: not judged


@dataclass(frozen=True, slots=True)
class PortVerdict:
    owner: PortOwner
    foreign: tuple[Listener, ...] = ()  # the reached sockets the tree does not hold


@dataclass(frozen=True, slots=True)
class PortCheck:
    """A verdict and, for a foreign socket, the process found holding it."""

    verdict: PortVerdict
    holder_pid: int | None = None  # of the first foreign socket, when readable


def judge_port(
    listeners: Sequence[Listener] | None, tree_inodes: frozenset[int], target: str, port: int
) -> PortVerdict:
    """Is the server's port answered by its own tree? `listeners` None: unreadable."""
    if listeners is None:
        return PortVerdict(PortOwner.UNKNOWN)
    landing = reached(listeners, target, port)
    foreign = tuple(entry for entry in landing if entry.inode not in tree_inodes)
    if landing and not foreign:
        return PortVerdict(PortOwner.OURS)
    return PortVerdict(PortOwner.FOREIGN, foreign)


def foreign_detail(target: str, port: int, verdict: PortVerdict, holder_pid: int | None) -> str:
    """What to tell the operator about a port another process answers on."""
    where = f"{target}:{port}"
    if not verdict.foreign:
        return f"{where} answered, but no socket of the server's tree listens there"
    holder = f"pid {holder_pid}" if holder_pid is not None else "a process this user cannot see"
    inode = verdict.foreign[0].inode
    return (
        f"{where} is answered by a listener the server's tree does not hold (socket {inode}, "
        f"{holder}): the server could not bind its port, and SGLang's warm-up talks to that one"
    )
