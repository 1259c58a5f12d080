"""The port's holder read from the real /proc: a loopback listener of this process is found in
its network namespace's table, among its own sockets, and named as a stranger's to another tree."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from supervisor.adapters.listeners import check_port, read_listeners, socket_inodes
from supervisor.core.listener import PortOwner


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock


def _inode(sock: socket.socket) -> int:
    return os.stat(f"/proc/self/fd/{sock.fileno()}").st_ino


def test_a_listening_socket_is_in_the_table_and_among_its_holders_sockets(listening):
    port = listening.getsockname()[1]
    table = read_listeners(os.getpid())
    assert table is not None
    mine = [entry for entry in table if entry.port == port]
    assert [(e.address, e.inode) for e in mine] == [("127.0.0.1", _inode(listening))]
    assert _inode(listening) in socket_inodes([os.getpid()])


def test_the_port_is_ours_for_its_holder_and_foreign_for_another_tree(listening):
    port = listening.getsockname()[1]
    assert check_port(os.getpid(), (), "127.0.0.1", port).verdict.owner is PortOwner.OURS
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        check = check_port(other.pid, (other.pid,), "127.0.0.1", port)
    finally:
        other.communicate(b"")
    assert check.verdict.owner is PortOwner.FOREIGN
    assert check.holder_pid == os.getpid()


def test_an_unreadable_table_is_unknown(tmp_path):
    assert read_listeners(1, proc=tmp_path) is None
    assert check_port(1, (), "127.0.0.1", 1, proc=tmp_path).verdict.owner is PortOwner.UNKNOWN
