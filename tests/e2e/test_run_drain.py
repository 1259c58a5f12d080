"""A stop with a request in flight, end to end: a drain that ends within the grace is no cut and
`stopped` says how long it took; a request longer than the grace is cut, and `drain_cut` says
how many requests SGLang still counted."""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from tests.e2e.run_support import Supervisor, supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@contextmanager
def one_request_in_flight(sup: Supervisor) -> Iterator[list[object]]:
    """A /generate request, started and seen running (SGLang's own metric); yields what it got
    (a status code, or the error of a request the server lost) once the client is done."""
    base = f"http://127.0.0.1:{sup.port}"
    answers: list[object] = []

    def ask() -> None:
        try:
            answers.append(requests.post(f"{base}/generate", json={}, timeout=120).status_code)
        except requests.RequestException as exc:
            answers.append(repr(exc))

    def in_flight() -> bool:
        metrics = requests.get(f"{base}/metrics", timeout=5).text
        return re.search(r"sglang:num_running_reqs\{[^}]*\} 1\b", metrics) is not None

    client = threading.Thread(target=ask)
    client.start()
    try:
        wait_until(in_flight, timeout_s=20, what="the request in flight")
        yield answers
    finally:
        client.join(timeout=130)


def test_a_request_longer_than_the_grace_is_a_drain_cut_with_one_request_remaining(
    tmp_path: Path, free_port: int, simulated_process_guard: str
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"request_s": 600.0},
        server_args=("--tp", "2", "--enable-metrics"),
        options=("--stop-grace", "3s"),
    ) as sup:
        sup.wait_event("ready")
        with one_request_in_flight(sup) as answers:
            sup.signal(signal.SIGTERM)
            assert sup.wait_exit(timeout_s=60) == 0
        assert len(answers) == 1
        assert answers[0] != 200  # the SIGKILL reset it
        cut = sup.wait_event("drain_cut")
        assert (cut["grace_s"], cut["remaining_requests"], cut["level"]) == (3.0, 1, "warning")
        assert cut["drained_s"] >= 3.0
        assert 0.0 <= cut["counted_after_s"] <= cut["drained_s"]
        stopped = sup.wait_event("stopped")
        assert (stopped["drained_s"], stopped["drain"]) == (cut["drained_s"], "cut_by_grace")
        assert sup.tree() == []


def test_a_request_shorter_than_the_grace_drains_with_no_cut_and_its_duration_logged(
    tmp_path: Path, free_port: int, simulated_process_guard: str
):
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        scenario={"request_s": 2.0},
        server_args=("--tp", "2", "--enable-metrics"),
        options=("--stop-grace", "60s"),
    ) as sup:
        sup.wait_event("ready")
        with one_request_in_flight(sup) as answers:
            sup.signal(signal.SIGTERM)
            assert sup.wait_exit(timeout_s=60) == 0
        assert answers == [200]
        assert not sup.events("drain_cut")
        stopped = sup.wait_event("stopped")
        assert 0.0 < stopped["drained_s"] < 60.0
        assert stopped["drain"] == "exited"
        output = [e["line"] for e in sup.events("server_output")]
        assert any("Remaining number of requests 1." in line for line in output)
        assert sup.tree() == []
