"""The wait for the leader's address: asked every 2 s on the runner's clock, bounded by
resolve_timeout (exit 2 naming the address), ended by a stop signal."""

from __future__ import annotations

import signal

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.group_http import resolves
from supervisor.core.events import SignalEvent
from supervisor.errors import ConfigError
from supervisor.group.resolve import format_duration, wait_until_resolved
from supervisor.run.events import EventClock, StopRequested
from tests.fakes import FakeClock, FakeEvents


class Dns:
    """Resolves `name` from `after_s` on (the fake clock's time)."""

    def __init__(self, clock: FakeClock, after_s: float) -> None:
        self.clock = clock
        self.after_s = after_s
        self.asked: list[float] = []

    def __call__(self, name: str) -> bool:
        self.asked.append(self.clock.monotonic())
        return name == "leader.lws" and self.clock.monotonic() >= self.after_s


def test_an_address_that_resolves_at_once_is_not_waited_for():
    clock = FakeClock(start_s=0.0)
    with capture_logs() as logs:
        wait_until_resolved("leader.lws", clock=clock, timeout_s=600.0, resolves=Dns(clock, 0.0))
    assert clock.monotonic() == 0.0
    assert logs == []


def test_a_late_address_is_asked_for_every_2_s_until_it_resolves():
    clock = FakeClock(start_s=0.0)
    dns = Dns(clock, after_s=5.0)
    with capture_logs() as logs:
        wait_until_resolved("leader.lws", clock=clock, timeout_s=600.0, resolves=dns)
    assert dns.asked == [0.0, 2.0, 4.0, 6.0]
    assert [e["event"] for e in logs] == ["group_leader_resolving", "group_leader_resolved"]
    assert logs[1]["waited_s"] == 6.0


def test_an_address_that_never_resolves_is_bad_input_after_the_bound():
    clock = FakeClock(start_s=0.0)
    with pytest.raises(ConfigError) as err:
        wait_until_resolved("leader.lws", clock=clock, timeout_s=600.0, resolves=Dns(clock, 1e9))
    assert err.value.exit_code == 2
    assert str(err.value) == (
        "the leader address leader.lws does not resolve after 10 min ([group] resolve_timeout)"
    )
    assert clock.monotonic() == 600.0


def test_a_stop_signal_ends_the_wait():
    clock = FakeClock(start_s=0.0)
    events = FakeEvents(clock)
    events.at(7.0, SignalEvent(signal.SIGTERM, "SIGTERM"))
    with pytest.raises(StopRequested):
        wait_until_resolved(
            "leader.lws",
            clock=EventClock(clock, events),
            timeout_s=600.0,
            resolves=Dns(clock, 1e9),
        )
    assert clock.monotonic() == 7.0


def test_the_adapter_resolves_names_and_addresses_without_the_network():
    assert resolves("localhost")
    assert resolves("127.0.0.1")
    assert not resolves("bad..label")  # refused before any lookup


@pytest.mark.parametrize(
    ("seconds", "text"), [(600.0, "10 min"), (90.0, "1.5 min"), (7200.0, "2 h"), (5.0, "5 s")]
)
def test_durations_read_as_people_write_them(seconds, text):
    assert format_duration(seconds) == text
