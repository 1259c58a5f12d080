"""A stop with a long request in flight, against the real server at TP 1: a drain within the
grace lets the request complete (200, exit 0, the drain's duration logged); a grace shorter
than the request is a `drain_cut` with SGLang's last count of remaining requests.

Requests are sized in tokens from the decode speed measured just before (the machine may be
loaded: 270-400 tokens/s on two quiet cores, ten times less beside a stress test)."""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.real_sglang.lane import (
    LANE_MARKS,
    Leftovers,
    RealSupervisor,
    decode_rate_tok_s,
    generate,
    real_supervisor,
)
from tests.waiting import wait_until

pytestmark = LANE_MARKS
MAX_TOKENS = 12000  # the model's context is 16384


def running_requests(port: int) -> int:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = re.search(r"^sglang:num_running_reqs\{[^}]*\} ([\d.]+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


@contextmanager
def request_in_flight(sup: RealSupervisor, tokens: int, timeout_s: float) -> Iterator[list[object]]:
    """A /generate of `tokens` tokens, seen running (SGLang's own metric); yields what it got
    (a status code, or the error of a request the server lost) once the client is done."""
    answers: list[object] = []

    def ask() -> None:
        try:
            answers.append(generate(sup.port, tokens, timeout_s=timeout_s).status_code)
        except requests.RequestException as exc:
            answers.append(repr(exc))

    client = threading.Thread(target=ask)
    client.start()
    try:
        wait_until(lambda: running_requests(sup.port) == 1, timeout_s=60, what="in flight")
        yield answers
    finally:
        client.join(timeout=timeout_s + 10)


def test_a_planned_stop_drains_the_request_in_flight(tmp_path: Path, simulated_process_guard: str):
    left: list[Leftovers] = []
    options = ("--stop-grace", "600s")
    with real_supervisor(tmp_path, simulated_process_guard, options=options, leftovers=left) as sup:
        sup.wait_ready()
        tokens = min(MAX_TOKENS, max(200, int(decode_rate_tok_s(sup.port) * 8)))  # about 8 s
        with request_in_flight(sup, tokens, timeout_s=600) as answers:
            sup.signal(signal.SIGTERM)
            assert sup.wait_exit(timeout_s=620) == 0
        assert answers == [200], tokens
        stopped = sup.wait_event("stopped")
        assert stopped["drained_s"] > 0
        assert not sup.events("drain_cut")
        assert any("Draining requests and shutting down" in line for line in sup.output())
    (after,) = left
    assert (after.processes, after.cgroups) == ([], [])


def test_a_grace_shorter_than_the_request_is_a_drain_cut(
    tmp_path: Path, simulated_process_guard: str
):
    left: list[Leftovers] = []
    options = ("--stop-grace", "6s")
    with real_supervisor(tmp_path, simulated_process_guard, options=options, leftovers=left) as sup:
        sup.wait_ready()
        tokens = min(MAX_TOKENS, max(2000, int(decode_rate_tok_s(sup.port) * 60)))  # a minute
        with request_in_flight(sup, tokens, timeout_s=600) as answers:
            sup.signal(signal.SIGTERM)
            assert sup.wait_exit(timeout_s=120) == 0
        assert len(answers) == 1
        assert answers[0] != 200  # the SIGKILL at the grace's end reset it
        cut = sup.wait_event("drain_cut")
        assert (cut["grace_s"], cut["remaining_requests"], cut["level"]) == (6.0, 1, "warning")
        assert cut["drained_s"] >= 6.0
        assert sup.wait_event("stopped")["drained_s"] == cut["drained_s"]
        # SGLang's own count, every 5 s while it drains (its "Gracefully exiting" line).
        assert any("Remaining number of requests 1" in line for line in sup.output())
    (after,) = left
    assert (after.processes, after.cgroups) == ([], [])
