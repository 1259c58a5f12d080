"""`run` while the server prints pathological output and a rank leaks: megabyte lines, a
200,000-character word and CJK text without spaces, round after round (the scenario's
`output_flood`). Masking such a line was quadratic and held the GIL: the watchdog never acted,
the kernel's OOM killer did, probes stopped answering and SIGTERM went unheard. Here the
watchdog kills (its own event and reason), /healthz answers all along, SIGTERM ends with 0."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from supervisor.adapters.output_lines import MAX_LINE_BYTES
from tests.e2e.run_support import Supervisor, supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MiB = 2**20

# The tree's real bytes, unscaled: the pre-flight's overheads are what a simulated 2-rank tree
# really uses (~65 MiB of Python, the flood's few MiB included), so budget + margin sits 16 MiB
# above it and only the leak crosses it (as tests/e2e/test_watchdog_run.py).
OVERRIDES: dict[str, dict[str, Any]] = {
    "preflight": {"per_rank_overhead": "20MiB", "main_overhead": "40MiB"},
    "watchdog": {
        "enabled": True,
        "tree_margin_percent": 0.0,
        "tree_margin": "16MiB",
        # The host levels stay far below anything a shared test machine reaches.
        "warn": "3MiB",
        "terminate": "2MiB",
        "kill": "1MiB",
        "warn_percent": 0.0,
        "terminate_percent": 0.0,
        "kill_percent": 0.0,
    },
    "http": {"listen": "127.0.0.1:0"},
    "log": {"server_output": "raw"},  # SGLang's lines as printed: a smaller log to read back
}
SCENARIO = {
    "startup_s": 0.1,
    # 1 MiB line, 200,000-character word, 8,000 CJK characters, every 0.3 s from the start.
    "output_flood": {"every_s": 0.3},
    "leak": {"rank": 1, "bytes_per_s": 16 * MiB, "after_s": 2.0, "max_bytes": 48 * MiB},
}


class Follower:
    """The supervisor's log read as it grows (never re-read whole: the flood makes it large)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.events: list[dict[str, Any]] = []
        self.longest_server_line = 0
        self.cut_server_lines = 0

    def poll(self) -> None:
        """Read what was appended since the last poll."""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for raw in lines:
            if raw.startswith(b"[sglang] "):  # log.server_output = "raw"
                self.longest_server_line = max(self.longest_server_line, len(raw) - 9)
                self.cut_server_lines += b"\xe2\x80\xa6[cut " in raw
            elif raw.startswith(b"{"):
                self.events.append(json.loads(raw))

    def wait_cut_line(self) -> None:
        """Until one more line cut to the bound has reached the log."""
        seen = self.cut_server_lines

        def more() -> bool:
            self.poll()
            return self.cut_server_lines > seen

        wait_until(
            more,
            timeout_s=30,
            interval_s=0.1,
            what="one more cut line of the server",
        )

    def named(self, name: str) -> list[dict[str, Any]]:
        self.poll()
        return [e for e in self.events if e.get("event") == name]

    def wait(self, name: str, count: int = 1, timeout_s: float = 60.0) -> dict[str, Any]:
        found = wait_until(
            lambda: ev if len(ev := self.named(name)) >= count else None,
            timeout_s=timeout_s,
            interval_s=0.1,
            what=f"{count} {name} event(s); last events {[e['event'] for e in self.events[-8:]]}",
        )
        assert found is not None
        return found[count - 1]


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    # A kubelet probe waits 1 s; this generous deadline only bounds a frozen supervisor.
    answer = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    body: dict[str, Any] = answer.json()
    return answer.status_code, body


@pytest.fixture
def flooded(tmp_path: Path, free_port: int, simulated_process_guard: str) -> Iterator[Supervisor]:
    with supervisor(
        tmp_path, free_port, simulated_process_guard, scenario=SCENARIO, overrides=OVERRIDES
    ) as sup:
        yield sup


def test_the_watchdog_kills_probes_answer_and_sigterm_stops_under_pathological_output(
    flooded: Supervisor,
):
    log = Follower(flooded.log_path)
    port = log.wait("http_listening")["port"]
    limits = log.wait("watchdog_limits")
    assert limits["tree_kill_bytes"] == limits["tree_budget_bytes"] + 16 * MiB
    log.wait("ready")  # the load went through the flood
    for _ in range(3):  # each probe while lines are still being cut
        log.wait_cut_line()
        code, body = healthz(port)
        assert code == 200, body
        assert body["live"] is True

    killed = log.wait("server_killed")
    assert killed["cause"] == "memory_kill"  # the watchdog's own kill, not the kernel's
    assert "tree" in killed["reason"]
    assert log.wait("server_failed")["failure"] == "memory_kill"
    # Still answering: not live until the relaunch, and saying why.
    code, body = healthz(port)
    if code != 200:
        assert "memory watchdog" in body["reason"] or "server" in body["reason"], body

    flooded.signal(signal.SIGTERM)
    assert flooded.wait_exit(timeout_s=60) == 0
    log.poll()
    # Every line of the server's reached the log cut to the bound (with its mark).
    assert log.cut_server_lines >= 6
    assert log.longest_server_line <= MAX_LINE_BYTES + 40
    assert not [e for e in log.events if e.get("failure") == "kernel_oom_killed"]
