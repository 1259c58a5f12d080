"""A worker's watch of its leader (supervisor/group/peer.py) against a real loopback listener
playing the leader's supervisor: its /healthz is the real probes' (group/health.py), fed the
leader's log events. Answers keep the watch quiet; misses in a row kill the local tree and post
the death `peer_lost`; a stopped tree or a stopped watch is left alone."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from supervisor.adapters import group_http
from supervisor.adapters.http_server import HttpListener, Request, Response
from supervisor.config import RunSettings
from supervisor.core.classify import FailureKind
from supervisor.core.events import STOP_REQUESTED, Event, MemoryAction, WatchdogEvent
from supervisor.group.health import NodeProbes
from supervisor.group.peer import LeaderWatch, WatchTiming
from supervisor.run.group_mode import group_plugins, leader_watch
from supervisor.run.plugins import LaunchInfo
from tests.fakes.clock import FakeClock
from tests.fakes.server import FakeServer
from tests.group.support import spec
from tests.run.runner_support import settings
from tests.waiting import wait_until


def _get(url: str, timeout_s: float) -> group_http.Answer:
    return group_http.get(url, timeout_s=timeout_s)


@dataclasses.dataclass
class Leader:
    """The leader's supervisor: its probes on a listener, asked how often."""

    listener: HttpListener
    probes: NodeProbes
    asked: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.port}/healthz"

    def serve(self, probes: NodeProbes) -> None:
        """Answer with `probes` from now on (a new supervisor behind the same address)."""
        self.probes = probes

    def healthz(self, request: Request) -> Response:
        self.asked += 1
        return self.probes.healthz(request)

    def dies(self) -> None:
        """The leader's ranks died: its supervisor files it (its /healthz says 503)."""
        self.probes({"event": "unhealthy", "cause": "rank_crash", "detail": "TP1 exited"})


@pytest.fixture
def leader() -> Iterator[Leader]:
    listener = HttpListener("127.0.0.1", 0)
    served = Leader(listener, NodeProbes(group=True))
    listener.route("/healthz", served.healthz)
    listener.start()
    served.probes({"event": "launching"})
    yield served
    listener.close()


@dataclasses.dataclass
class Worker:
    server: FakeServer
    posted: list[Event]
    watch: LeaderWatch


def worker(url: str, *, threshold: int = 3, interval_s: float = 0.01) -> Worker:
    server = FakeServer(pid=500, run_id="w1", ranks=2)
    posted: list[Event] = []
    watch = LeaderWatch(
        url,
        server,
        posted.append,
        get=_get,
        timing=WatchTiming(interval_s=interval_s, timeout_s=2.0, threshold=threshold),
        clock=FakeClock(start_s=100.0),
        run_id="w1",
    )
    return Worker(server, posted, watch)


def test_a_live_leader_keeps_the_watch_quiet_and_it_stops_cleanly(leader):
    node = worker(leader.url)
    node.watch.start()
    wait_until(lambda: leader.asked >= 5, what="the watch to ask the leader five times")
    node.watch.stop()
    assert not node.watch._thread.is_alive()
    assert not node.watch.lost.is_set()
    assert (node.server.reasons, node.posted) == ([], [])
    assert node.server.main_alive


def test_a_leader_whose_tree_died_gets_this_tree_killed_and_the_death_posted(leader):
    node = worker(leader.url)
    with capture_logs() as logs:
        node.watch.start()
        wait_until(lambda: leader.asked >= 2, what="the watch to ask the leader")
        leader.dies()
        wait_until(node.watch.lost.is_set, what="the leader to be found lost")
        node.watch.stop()
    reason = node.server.kill_reason
    assert reason is not None
    assert reason.failure is FailureKind.PEER_LOST
    assert not node.server.main_alive
    assert not node.server.ranks
    [event] = node.posted
    assert isinstance(event, WatchdogEvent)
    assert (event.action, event.failure) == (MemoryAction.KILLED, FailureKind.PEER_LOST)
    assert event.pids == (500, 501, 502)
    assert event.at_s == 100.0
    assert "failed 3 checks in a row" in event.reason
    lost = [e for e in logs if e["event"] == "group_leader_lost"]
    assert len(lost) == 1
    assert lost[0]["log_level"] == "error"
    assert (lost[0]["url"], lost[0]["misses"]) == (leader.url, 3)
    assert lost[0]["last_answer"] == "HTTP 503: server unhealthy: rank_crash: TP1 exited"
    assert (lost[0]["run_id"], lost[0]["server_pid"]) == ("w1", 500)


def test_an_answer_between_misses_starts_the_count_again(leader):
    node = worker(leader.url)
    assert node.watch.ask_once() is False
    dead, alive = NodeProbes(group=True), leader.probes
    dead({"event": "unhealthy", "cause": "health_timeout"})
    # The same supervisor cannot come back, but its answers may: here only the count matters.
    leader.serve(dead)
    assert [node.watch.ask_once() for _ in range(2)] == [False, False]
    leader.serve(alive)
    assert node.watch.ask_once() is False
    leader.serve(dead)
    assert [node.watch.ask_once() for _ in range(3)] == [False, False, True]
    assert node.server.kill_reason is not None


def test_a_leader_nobody_answers_for_is_lost_from_the_first_question(free_port):
    node = worker(f"http://127.0.0.1:{free_port}/healthz", threshold=2)
    assert node.watch.ask_once() is False
    assert node.watch.ask_once() is True
    assert node.watch.seen.last_answer == "no answer: connection refused"
    [event] = node.posted
    assert isinstance(event, WatchdogEvent)
    assert event.failure is FailureKind.PEER_LOST


def test_a_restarted_leader_that_answers_200_is_lost_all_the_same(leader):
    node = worker(leader.url, threshold=2)
    assert node.watch.ask_once() is False
    leader.serve(NodeProbes(group=True))  # a new supervisor: live, waiting for reports
    assert node.watch.ask_once() is False
    assert node.watch.ask_once() is True
    assert "the leader was restarted" in node.watch.seen.last_answer


def test_a_leader_that_does_not_answer_in_time_is_a_miss():
    release = threading.Event()
    listener = HttpListener("127.0.0.1", 0)
    listener.route("/healthz", lambda _r: Response(200) if release.wait(10) else Response(500))
    listener.start()
    try:
        node = worker(f"http://127.0.0.1:{listener.port}/healthz", threshold=3)
        node.watch.timing = WatchTiming(interval_s=0.01, timeout_s=0.2, threshold=3)
        assert node.watch.ask_once() is False
        assert node.watch.seen.last_answer == "no answer: no answer within 0.2 s"
    finally:
        release.set()
        listener.close()


def test_a_tree_that_is_being_stopped_is_left_to_the_stop(free_port):
    node = worker(f"http://127.0.0.1:{free_port}/healthz", threshold=1)
    node.server.terminate(STOP_REQUESTED)  # SIGTERM: the leader may well go first
    with capture_logs() as logs:
        assert node.watch.ask_once() is True  # nothing more to ask
    assert node.server.reasons == [STOP_REQUESTED]
    assert node.posted == []
    assert not [e for e in logs if e["event"] == "group_leader_lost"]


def test_only_a_worker_watches_its_leader(tmp_path):
    base = settings(tmp_path, ("--model-path", "m", "--tp", "4"))
    leader_node = dataclasses.replace(base, group=spec(2, 0, gate_port=0))
    worker_node = dataclasses.replace(base, group=spec(2, 1, gate_port=0))
    assert leader_watch(base) is None
    assert leader_watch(leader_node) is None
    assert group_plugins(leader_node).components == ()
    assert len(group_plugins(worker_node).components) == 1
    factory = leader_watch(worker_node)
    assert factory is not None
    # No listener configured: the leader is asked on the group's default port, 9400.
    server = FakeServer(pid=7, run_id="r", ranks=1)
    watch = factory(server, lambda _e: None, _info(worker_node))
    assert isinstance(watch, LeaderWatch)
    assert watch.url == "http://127.0.0.1:9400/healthz"
    assert watch.timing == WatchTiming(
        base.run.health_interval_s, base.run.health_timeout_s, base.run.failure_threshold
    )


def _info(start: RunSettings) -> LaunchInfo:
    """What a component factory is told of a launch."""
    argv = tuple(start.server_args)
    return LaunchInfo(run_id="r", argv=argv, plan=start.reader.plan(argv), fit=None)
