"""sd_notify over a real AF_UNIX datagram socket, path and abstract-namespace addresses; a
receiver that stopped reading: never a stall, STATUS= dropped and counted, READY=1 and
STOPPING=1 kept and sent once it reads again."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

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


def _fill(address: str) -> int:
    """Queue datagrams on `address` until the receiver's queue is full (net.unix.max_dgram_qlen:
    nobody reads); how many went in."""
    target = b"\0" + address[1:].encode() if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
        filler.connect(target)
        for count in range(100_000):
            try:
                filler.send(b"FILLER=1", socket.MSG_DONTWAIT)
            except BlockingIOError:
                return count
    raise AssertionError("the receiver's queue never filled")


def _drain(sock: socket.socket) -> list[bytes]:
    sock.setblocking(False)
    got = []
    while True:
        try:
            got.append(sock.recv(4096))
        except BlockingIOError:
            return got


def test_a_full_queue_drops_status_but_keeps_ready_pending_until_the_receiver_reads(
    abstract_socket,
):
    sock, address = abstract_socket
    notifier = SdNotifier({"NOTIFY_SOCKET": address})
    filled = _fill(address)
    # Each call returns at once: nothing is sent, nothing waits for the receiver.
    assert not notifier.status("loading")
    assert not notifier.watchdog()
    assert not notifier.ready("ready; restarts 0")
    assert not notifier.status("ready; restarts 0")
    assert notifier.dropped == 3
    assert list(notifier.pending) == ["READY=1\nSTATUS=ready; restarts 0"]
    assert _drain(sock) == [b"FILLER=1"] * filled
    # The next call of any kind sends the pending READY=1 first.
    assert notifier.status("serving")
    assert not notifier.pending
    assert _drain(sock) == [b"READY=1\nSTATUS=ready; restarts 0", b"STATUS=serving"]
    assert notifier.dropped == 3


def test_stopping_is_retried_like_ready_and_keeps_its_place_after_it(abstract_socket):
    sock, address = abstract_socket
    notifier = SdNotifier({"NOTIFY_SOCKET": address})
    filled = _fill(address)
    assert not notifier.ready()
    assert not notifier.stopping("stopping (run abc)")
    assert not notifier.watchdog()
    assert notifier.pending == ("READY=1", "STOPPING=1\nSTATUS=stopping (run abc)")
    assert len(_drain(sock)) == filled
    assert notifier.watchdog()
    assert _drain(sock) == [b"READY=1", b"STOPPING=1\nSTATUS=stopping (run abc)", b"WATCHDOG=1"]


def test_timeout_extensions_stop_once_ready_or_stopping_is_asked_for(abstract_socket):
    sock, address = abstract_socket
    now = [100.0]
    notifier = SdNotifier({"NOTIFY_SOCKET": address}, monotonic=lambda: now[0])
    assert notifier.extend_timeout(60)
    assert notifier.ready()
    now[0] += 10
    assert not notifier.extend_timeout(60)  # the unit is active: it would move nothing useful
    stopping = SdNotifier({"NOTIFY_SOCKET": address}, monotonic=lambda: now[0])
    assert stopping.stopping()
    assert not stopping.extend_timeout(60)  # it would move TimeoutStopSec
    assert _drain(sock) == [b"EXTEND_TIMEOUT_USEC=60000000", b"READY=1", b"STOPPING=1"]
    assert notifier.dropped == stopping.dropped == 0


def test_drops_are_logged_rarely_and_once_more_at_exit_with_what_systemd_never_got(
    abstract_socket,
):
    _sock, address = abstract_socket
    now = [100.0]
    notifier = SdNotifier({"NOTIFY_SOCKET": address}, monotonic=lambda: now[0])
    _fill(address)
    with capture_logs() as logs:
        notifier.status("a")
        notifier.watchdog()  # the first drop report comes at once
        notifier.status("b")
        now[0] += 599
        notifier.watchdog()  # within 10 minutes of the last report: counted, not logged
        now[0] += 1
        notifier.watchdog()
        notifier.ready()
        notifier.report_drops(at_exit=True)
    reports = [e for e in logs if e["event"] == "sd_notify_dropped"]
    assert [(e["dropped"], e["dropped_since_last"]) for e in reports] == [(2, 2), (5, 3), (5, 0)]
    assert [e["pending"] for e in reports] == [[], [], ["READY=1"]]
    assert all(e["log_level"] == "warning" for e in reports)


def test_nothing_is_logged_when_nothing_was_dropped(abstract_socket):
    _sock, address = abstract_socket
    notifier = SdNotifier({"NOTIFY_SOCKET": address})
    with capture_logs() as logs:
        assert notifier.watchdog()
        notifier.report_drops(at_exit=True)
    assert logs == []
