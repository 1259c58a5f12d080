"""The simulated torch.distributed world: the rendezvous at --dist-init-addr and the communicator.

Written from (paths under sglang/srt/ unless named): distributed/bootstrap.py
`_resolve_dist_init_method` (tcp://--dist-init-addr; without it the node's own --host and
nccl_port) and `_init_parallel_groups` (world rank = tp_size × pp_rank + tp_rank, which
topology.py's placement makes node_rank × ranks per node + local index);
distributed/parallel_state.py `init_distributed_environment` (torch's `init_process_group`:
world rank 0 hosts the TCPStore, every rank connects and waits for the whole world);
utils/network.py `NetworkAddress.parse` (its error messages). The torch errors are torch 2.13's
(c10d TCPStore / socket), read off a real run.

The simulation: world rank 0 listens on the address (the TCPStore master), every rank connects
(world rank 0 too, in-process), says "join R", and gets "go" once all `size` ranks joined. The
connections stay open as the communicator: the master relays the gate's activation and the
ShutdownReq, and when a rank's connection breaks (it died, or the master's node died) every
survivor learns it. A survivor then hangs after nccl_timeout_s, like a collective waiting on a
dead peer; the rank decides what hanging means (supervisor/testing/ranks.py).
Deviations: the master binds the address's host (loopback in tests), not every interface; a
connected rank has no timeout of its own (as torch's client, it waits on the master).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.testing.args import SimArgs
from supervisor.testing.scenario import Scenario

# How often a waiting rank retries a refused connection (torch backs off from 1 s; shorter here).
_RETRY_S = 0.1
_TICK_S = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """One rank's place in the torch world, picklable for the spawn children."""

    addr: str  # "HOST:PORT" or "[V6]:PORT", as --dist-init-addr gives it
    size: int
    rank: int
    timeout_s: float
    nccl_timeout_s: float
    gate_host: str  # --host: world rank 0 serves the gate there
    gate_port: int | None  # --gated-launch-port; None: no gate


class RendezvousError(Exception):
    """What init_process_group raises; the message is torch's "module.Class: text" line."""


def worlds(plan: SimArgs, scenario: Scenario, local_ranks: int) -> list[World | None]:
    """The World of each of this node's ranks, or Nones when the simulation has no rendezvous.

    With --dist-init-addr the world spans every node. Without it SGLang rendezvouses each node on
    its own --host:nccl_port; the simulation does that only when the gate needs a communicator
    (a worker node started alone must still come up: the existing tests run it so).
    """
    if plan.dist_init_addr is None and plan.gated_launch_port is None:
        return [None] * local_ranks
    addr, size, first = plan.dist_init_addr, local_ranks * plan.nnodes, local_ranks * plan.node_rank
    if addr is None:
        addr, size, first = _local_addr(plan.host), local_ranks, 0
    timeout_s = scenario.dist_timeout_s if plan.dist_timeout is None else plan.dist_timeout
    return [
        World(
            addr=addr,
            size=size,
            rank=first + i,
            timeout_s=float(timeout_s),
            nccl_timeout_s=scenario.nccl_timeout_s,
            gate_host=plan.host,
            gate_port=plan.gated_launch_port,
        )
        for i in range(local_ranks)
    ]


def _local_addr(host: str) -> str:
    """NetworkAddress(host, nccl_port): a port free a moment ago (get_free_port_below_ephemeral)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    return f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"


def parse_addr(addr: str) -> tuple[str, int]:
    """NetworkAddress.parse: "[::1]:8000", "127.0.0.1:8000", "name:8000" (ValueError otherwise)."""
    if not addr:
        raise ValueError("Empty address string")
    if addr.startswith("["):
        close = addr.find("]")
        if close == -1:
            raise ValueError(f"Missing closing bracket in IPv6 address: {addr!r}")
        host, rest = addr[1:close], addr[close + 1 :]
        if not _is_ipv6(host):
            raise ValueError(f"Invalid IPv6 address inside brackets: {host!r}")
        if not rest.startswith(":") or len(rest) < 2:
            raise ValueError(f"Expected ':port' after closing bracket, got: {rest!r}")
        return host, _port(rest[1:])
    if ":" not in addr:
        raise ValueError(f"Missing port in address (expected host:port): {addr!r}")
    host, port = addr.rsplit(":", 1)
    if not host:
        raise ValueError(f"Empty host in address: {addr!r}")
    if ":" in host and _is_ipv6(host):
        raise ValueError(
            f"Bare IPv6 address without brackets is ambiguous: {addr!r}. "
            f"Use [{host}]:{port} instead."
        )
    return host, _port(port)


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"Invalid port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"Port out of range (0-65535): {port}")
    return port


def _send(sock: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError):  # a peer that is gone is noticed by its reader
        sock.sendall(f"{line}\n".encode())


class Communicator:
    """This rank's end of the world: flags set by the communicator's threads, read by the rank."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.go = threading.Event()
        self.activated = threading.Event()  # the gate's broadcast said 1
        self.shutdown = threading.Event()  # rank 0's ShutdownReq reached this rank
        self.closed = threading.Event()  # the master's end closed before "go"
        self._broken_at: float | None = None
        self._lock = threading.Lock()
        self._master: _Master | None = None

    @classmethod
    def join(cls, world: World, serve: Callable[[float], None]) -> Communicator:
        """init_process_group: host (rank 0) or connect, then wait for the whole world.

        `serve(seconds)` waits while the rank keeps answering its main process.

        Raises:
            ValueError: --dist-init-addr cannot be parsed (NetworkAddress.parse's message).
            RendezvousError: torch's failure (port taken, nobody listening, world incomplete).
        """
        host, port = parse_addr(world.addr)
        comm = cls(world)
        began = time.monotonic()
        if world.rank == 0:
            comm._master = _Master(comm, host, port)
            comm._master.wait_for_world(began, serve)
            return comm
        sock = _connect(host, port, began + world.timeout_s, world.timeout_s, serve)
        _send(sock, f"join {world.rank}")
        threading.Thread(target=comm._read, args=(sock,), name="comm", daemon=True).start()
        while not comm.go.is_set():
            if comm.closed.is_set():
                raise RendezvousError(
                    "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection "
                    "was likely closed. Did the remote server shutdown or crash?"
                )
            serve(_TICK_S)
        return comm

    def broadcast(self, message: str) -> None:
        """World rank 0 tells every rank: "activate" (the gate) or "shutdown" (ShutdownReq)."""
        if self._master is not None:
            self._master.broadcast(message)
        if message == "activate":
            self.activated.set()

    def break_off(self) -> None:
        """A peer is gone: the next collective will wait on it for good."""
        with self._lock:
            if self._broken_at is None:
                self._broken_at = time.monotonic()

    def hung(self) -> bool:
        """True once a broken communicator has kept this rank waiting nccl_timeout_s."""
        with self._lock:
            broken_at = self._broken_at
        return broken_at is not None and time.monotonic() - broken_at >= self.world.nccl_timeout_s

    def _read(self, sock: socket.socket) -> None:
        """A client's end: the master's messages, then EOF when the master's process is gone."""
        with sock, sock.makefile("r", encoding="ascii", errors="replace") as lines:
            try:
                for line in lines:
                    word = line.split(" ", 1)[0].strip()
                    if word == "go":
                        self.go.set()
                    elif word == "activate":
                        self.activated.set()
                    elif word == "shutdown":
                        self.shutdown.set()
                    elif word == "broken":
                        self.break_off()
            except OSError:
                pass
        if self.go.is_set():
            self.break_off()
        else:
            self.closed.set()


def _connect(
    host: str, port: int, deadline: float, timeout_s: float, serve: Callable[[float], None]
) -> socket.socket:
    """TCPStore's client: retry while nothing listens, until the timeout."""
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
            sock.settimeout(None)
            return sock
        except OSError:
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    "torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{round(timeout_s * 1000)}ms while trying to connect to ({host}, {port})."
                ) from None
            serve(_RETRY_S)


def _listen(host: str, port: int) -> socket.socket:
    """Bind the store's port on the address's host (each of its addresses in turn)."""
    last: OSError = OSError(errno.EADDRNOTAVAIL, "cannot assign requested address")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        infos, last = [], exc
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(64)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    name = errno.errorcode.get(last.errno or 0, "UNKNOWN")
    reason = (last.strerror or str(last)).lower()
    raise RendezvousError(
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        f"local network address. port: {port}, useIpv6: false, code: -{last.errno or 0}, "
        f"name: {name}, message: {reason}"
    )


class _Master:
    """World rank 0's TCPStore: counts the joins, says "go", then relays and watches."""

    def __init__(self, comm: Communicator, host: str, port: int) -> None:
        self.comm = comm
        self.size = comm.world.size
        self.listener = _listen(host, port)
        self.lock = threading.Lock()
        self.peers: dict[int, socket.socket] = {}
        self.stopping = False  # the ShutdownReq went out: peers leaving is expected
        threading.Thread(target=self._accept, name="store", daemon=True).start()
        self._maybe_go()

    def wait_for_world(self, began: float, serve: Callable[[float], None]) -> None:
        while not self.comm.go.is_set():
            if time.monotonic() >= began + self.comm.world.timeout_s:
                with self.lock:
                    joined = 1 + len(self.peers)
                self.close()  # the store goes with the exception: connected ranks see EOF
                raise RendezvousError(
                    "torch.distributed.DistStoreError: Timed out after "
                    f"{math.ceil(time.monotonic() - began)} seconds waiting for clients. "
                    f"{joined}/{self.size} clients joined."
                )
            serve(_TICK_S)

    def close(self) -> None:
        with self.lock:
            socks = [self.listener, *self.peers.values()]
            self.peers.clear()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def broadcast(self, message: str) -> None:
        with self.lock:
            self.stopping = self.stopping or message == "shutdown"
            for sock in self.peers.values():
                _send(sock, message)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve_peer, args=(sock,), daemon=True).start()

    def _maybe_go(self) -> None:
        with self.lock:
            if self.comm.go.is_set() or 1 + len(self.peers) < self.size:
                return
            for sock in self.peers.values():
                _send(sock, "go")
            self.comm.go.set()

    def _serve_peer(self, sock: socket.socket) -> None:
        with sock, sock.makefile("r", encoding="ascii", errors="replace") as lines:
            rank = self._register(sock, lines.readline())
            if rank is None:
                return
            self._maybe_go()
            with contextlib.suppress(OSError):
                for _line in lines:
                    pass  # peers only ever say "join"; reading waits for their end
        self._lost(rank, sock)

    def _register(self, sock: socket.socket, line: str) -> int | None:
        word, _, value = line.strip().partition(" ")
        rank = int(value) if word == "join" and value.isdigit() else -1
        with self.lock:
            if not 0 < rank < self.size or rank in self.peers or self.comm.go.is_set():
                return None  # a stranger, a twin, or a latecomer: not part of this world
            self.peers[rank] = sock
        return rank

    def _lost(self, rank: int, sock: socket.socket) -> None:
        with self.lock:
            if self.peers.get(rank) is not sock:
                return  # closed by us
            del self.peers[rank]
            if not self.comm.go.is_set() or self.stopping:
                return  # before "go" the world just waits for it again
            for peer in self.peers.values():
                _send(peer, f"broken {rank}")
        self.comm.break_off()
