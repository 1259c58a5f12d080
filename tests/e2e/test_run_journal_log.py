"""`run --log-format journal` end to end: every line the supervisor writes starts with its syslog
priority, so `journalctl -p err` finds exactly the errors, and reads as a sentence."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.run_support import Supervisor, supervisor
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

PRIORITY = re.compile(r"^<([0-7])>(.*)$")


def lines_by_priority(sup: Supervisor) -> list[tuple[int, str]]:
    out = []
    for line in sup.log_text().splitlines():
        match = PRIORITY.match(line)
        assert match, f"a line without its priority: {line!r}"
        out.append((int(match.group(1)), match.group(2)))
    return out


def wait_line(sup: Supervisor, text: str, count: int = 1) -> None:
    wait_until(
        lambda: sum(text in line for line in sup.log_text().splitlines()) >= count,
        timeout_s=30,
        what=f"{count} line(s) with {text!r}",
        context=lambda: f"log tail: {sup.log_text()[-1500:]!r}",
    )


def test_a_crash_and_restart_in_journal_lines_with_their_priorities(
    tmp_path: Path, free_port: int, simulated_process_guard: str
) -> None:
    with supervisor(
        tmp_path,
        free_port,
        simulated_process_guard,
        options=["--log-format", "journal", "--backoff-initial", "10ms"],
    ) as sup:
        wait_line(sup, "server ready")
        os.kill(sup.schedulers()["sglang::scheduler_TP1"], signal.SIGKILL)
        wait_line(sup, "server ready", count=2)
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
    lines = lines_by_priority(sup)
    errors = [text for prio, text in lines if prio <= 3]
    infos = [text for prio, text in lines if prio == 6]
    # What `journalctl -p err` would show: the death and nothing routine.
    assert any(text.startswith("server unhealthy") for text in errors), errors
    assert not any("server ready" in text for text in errors)
    assert sum(text.startswith("server ready") for text in infos) == 2
    assert any(text.startswith("restarting after rank_crash") for text in infos), infos
    assert infos[-1].startswith("server stopped")
