"""sd_notify over a real AF_UNIX datagram socket, path and abstract-namespace addresses."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.adapters.systemd import SdNotifier


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify")
    sock.bind(address)
    sock.settimeout(5)
    yield sock, address
    sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"sglang-supervisor-test-{uuid.uuid4().hex}"
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    yield sock, "@" + name
    sock.close()


def test_ready_and_status_arrive_as_one_datagram_on_a_path_socket(path_socket):
    sock, address = path_socket
    notifier = SdNotifier({"NOTIFY_SOCKET": address})
    assert notifier.ready("ready: 2 ranks")
    assert sock.recv(4096) == b"READY=1\nSTATUS=ready: 2 ranks"


def test_abstract_namespace_addresses_start_with_at(abstract_socket):
    sock, address = abstract_socket
    notifier = SdNotifier({"NOTIFY_SOCKET": address})
    assert notifier.status("loading\nweights   (restart 2)")
    assert notifier.watchdog()
    assert notifier.extend_timeout(90.5)
    assert notifier.stopping()
    assert [sock.recv(4096) for _ in range(4)] == [
        b"STATUS=loading weights (restart 2)",
        b"WATCHDOG=1",
        b"EXTEND_TIMEOUT_USEC=90500000",
        b"STOPPING=1",
    ]


def test_without_notify_socket_every_call_is_a_silent_no_op():
    notifier = SdNotifier({})
    assert not notifier.enabled
    assert not notifier.ready()
    assert notifier.errors == 0
    assert notifier.watchdog_interval_s is None


def test_a_socket_nobody_listens_on_is_counted_not_raised(tmp_path):
    notifier = SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert not notifier.ready()
    assert notifier.errors == 1


def test_watchdog_interval_is_half_of_watchdog_usec_and_only_for_this_pid():
    env = {"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}
    assert SdNotifier(env).watchdog_interval_s == 30.0
    assert SdNotifier({"WATCHDOG_USEC": "60000000"}).watchdog_interval_s == 30.0
    assert SdNotifier({**env, "WATCHDOG_PID": "1"}).watchdog_interval_s is None
    assert SdNotifier({"WATCHDOG_USEC": "junk"}).watchdog_interval_s is None


def test_a_receiver_that_stopped_reading_never_blocks_the_supervisor(abstract_socket):
    """A full datagram queue (net.unix.max_dgram_qlen) drops the message and counts it."""
    _sock, address = abstract_socket
    notifier = SdNotifier({"NOTIFY_SOCKET": address})
    sent = [notifier.status(f"loading {i}") for i in range(200)]  # nobody reads meanwhile
    assert not all(sent)
    assert notifier.errors == sent.count(False)


def test_timeout_extensions_are_sent_at_most_once_a_second(abstract_socket):
    sock, address = abstract_socket
    now = [100.0]
    notifier = SdNotifier({"NOTIFY_SOCKET": address}, monotonic=lambda: now[0])
    assert notifier.extend_timeout(90)
    now[0] += 0.5
    assert not notifier.extend_timeout(91)  # within the second: not sent
    now[0] += 0.5
    assert notifier.extend_timeout(92)
    assert [sock.recv(4096) for _ in range(2)] == [
        b"EXTEND_TIMEOUT_USEC=90000000",
        b"EXTEND_TIMEOUT_USEC=92000000",
    ]
