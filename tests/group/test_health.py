"""/healthz and /readyz folded from the run's log events: a node is live unless its server is
found dead, the run ended in a refusal, the watchdog is killing the tree or a GPU is being
treated; ready once the server is, and in a group once the group decided to launch."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Mapping
from typing import Any

import pytest
import requests
import structlog

from supervisor import log as sup_log
from supervisor.adapters.http_server import WORKERS, HttpListener, Request, Response
from supervisor.group.health import NodeProbes
from tests.waiting import wait_until


def feed(probes: NodeProbes, *events: Mapping[str, Any]) -> NodeProbes:
    for event in events:
        probes(event)
    return probes


LAUNCH = {"event": "group_decision", "state": "launch", "reason": ""}
UP = ({"event": "launching"}, {"event": "loading"}, {"event": "warming"}, {"event": "ready"})


def test_before_the_first_launch_a_node_is_live_but_not_ready():
    probes = NodeProbes(group=True)
    assert probes.live() == (True, "")
    assert probes.ready() == (False, "the group has not decided to launch yet")


def test_a_group_node_is_ready_only_once_the_group_launched_and_its_server_is_ready():
    probes = feed(NodeProbes(group=True), *UP)
    assert probes.ready() == (False, "the group has not decided to launch yet")
    feed(probes, LAUNCH)
    assert probes.ready() == (True, "")


def test_one_box_needs_no_group_decision():
    probes = feed(NodeProbes(group=False), UP[0], UP[1])
    assert probes.ready() == (False, "server loading")
    feed(probes, *UP[2:])
    assert probes.ready() == (True, "")


def test_a_refused_group_is_never_ready():
    probes = feed(
        NodeProbes(group=True),
        {"event": "group_decision", "state": "refused", "reason": "node 1 (b) does not fit"},
    )
    assert probes.ready() == (False, "the group refused to launch: node 1 (b) does not fit")


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (
            {"event": "unhealthy", "cause": "rank_crash", "detail": "scheduler_TP1 exited"},
            "server unhealthy: rank_crash: scheduler_TP1 exited",
        ),
        (
            {"event": "fatal", "reason": "the group must be recreated: rank_crash: ..."},
            "server fatal: the group must be recreated: rank_crash: ...",
        ),
        (
            {"event": "server_killed", "cause": "memory_kill", "reason": "2 GiB left"},
            "the memory watchdog is killing the server tree (memory_kill: 2 GiB left)",
        ),
        (
            {"event": "server_terminated", "cause": "memory_terminate", "reason": "4 GiB left"},
            "the memory watchdog is killing the server tree (memory_terminate: 4 GiB left)",
        ),
        (
            {
                "event": "gpu_event",
                "gpu": 3,
                "meaning": "GPU has fallen off the bus",
                "decision": "reboot",
                "target": True,
            },
            "a GPU is being treated for a driver event (GPU 3: GPU has fallen off the bus "
            "(decision reboot))",
        ),
    ],
)
def test_what_makes_a_ready_node_not_live(event, reason):
    probes = feed(NodeProbes(group=True), LAUNCH, *UP, event)
    assert probes.live() == (False, reason)
    assert probes.ready()[0] is False


def test_a_driver_event_the_supervisor_only_logs_keeps_the_node_live():
    probes = feed(
        NodeProbes(group=True),
        LAUNCH,
        *UP,
        {"event": "gpu_event", "gpu": 5, "decision": "restart", "target": False},
        {"event": "gpu_event", "gpu": 0, "decision": "log", "target": True},
    )
    assert probes.live() == (True, "")


def test_a_relaunch_on_one_box_makes_it_live_again():
    probes = feed(
        NodeProbes(group=False),
        *UP,
        {"event": "server_killed", "cause": "memory_kill", "reason": "x"},
        {"event": "unhealthy", "cause": "memory_kill"},
        {"event": "restarting", "failure": "memory_kill"},
    )
    assert probes.live() == (
        False,
        "the memory watchdog is killing the server tree (memory_kill: x)",
    )
    feed(probes, UP[0])
    assert probes.live() == (True, "")
    assert probes.ready() == (False, "server launching")


@pytest.fixture
def served():
    probes = NodeProbes(group=True)
    listener = HttpListener("127.0.0.1", 0)
    probes.serve_on(listener)
    listener.start()
    stream = io.StringIO()
    sup_log.configure_logging("json", "info", stream=stream)
    sup_log.add_sink(probes)
    yield f"http://127.0.0.1:{listener.port}"
    sup_log.remove_sink(probes)
    structlog.reset_defaults()
    listener.close()


def test_the_probes_follow_the_log_through_the_event_tap(served):
    log = structlog.get_logger("test")
    live = requests.get(f"{served}/healthz", timeout=10).json()
    me = live["supervisor_id"]  # names this supervisor in every answer (a worker's leader watch)
    assert live == {"live": True, "supervisor_id": me}
    not_ready = requests.get(f"{served}/readyz", timeout=10)
    assert not_ready.status_code == 503
    assert not_ready.json() == {
        "ready": False,
        "reason": "the group has not decided to launch yet",
        "supervisor_id": me,
    }
    log.info("group_decision", state="launch", reason="")
    for state in ("launching", "loading", "ready"):
        log.info(state)
    ready = requests.get(f"{served}/readyz", timeout=10)
    assert (ready.status_code, ready.json()) == (200, {"ready": True, "supervisor_id": me})
    log.error("unhealthy", cause="rank_crash", detail="scheduler_TP1 exited")  # dummy health: 200
    dead = requests.get(f"{served}/healthz", timeout=10)
    assert dead.status_code == 503
    assert dead.json() == {
        "live": False,
        "reason": "server unhealthy: rank_crash: scheduler_TP1 exited",
        "supervisor_id": me,
    }
    assert requests.get(f"{served}/readyz", timeout=10).status_code == 503


def test_the_probes_are_answered_while_every_other_worker_is_stuck():
    """They are routed as probes: served by threads of their own, ahead of a stuck /metrics."""
    probes = NodeProbes(group=False)
    listener = HttpListener("127.0.0.1", 0)
    release = threading.Event()
    entered: list[str] = []

    def stuck(request: Request) -> Response:
        entered.append(request.path)
        release.wait(30)
        return Response(200)

    listener.route("/metrics", stuck)
    probes.serve_on(listener)
    listener.start()
    try:
        with contextlib.ExitStack() as stack:
            for _ in range(WORKERS):  # every ordinary worker in a scrape that does not end
                sock = stack.enter_context(socket.create_connection(("127.0.0.1", listener.port)))
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            wait_until(lambda: len(entered) == WORKERS, timeout_s=10, what="every worker stuck")
            for path in ("/healthz", "/readyz"):
                answer = requests.get(f"http://127.0.0.1:{listener.port}{path}", timeout=10)
                assert answer.status_code in (200, 503)  # answered, whatever the state says
            release.set()
    finally:
        release.set()
        listener.close()
