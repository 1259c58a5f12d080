"""core.drain: SGLang's "Remaining number of requests N" read from one line, in bounded work."""

from __future__ import annotations

import pytest

from supervisor.core.drain import DrainLog, Remaining, remaining_requests

# tokenizer_manager.py sigterm_watchdog (0.5.23), through the main process's logger:
# f"Gracefully exiting... Remaining number of requests {remain_num_req}. Remaining requests
# {remaining_rids=}."
SGLANG_LINE = (
    "[2026-12-01 12:00:00] Gracefully exiting... Remaining number of requests 3. Remaining "
    "requests remaining_rids=['9f1c', 'a2b4', 'c7d0']."
)


@pytest.mark.parametrize(
    ("line", "count"),
    [
        (SGLANG_LINE, 3),
        (
            "[2026-12-01 12:00:05] Gracefully exiting... Remaining number of requests 0. "
            "Remaining requests remaining_rids=[].",
            0,
        ),
        ("[2026-12-01 12:00:05 TP0] Gracefully exiting... Remaining number of requests 12. x", 12),
        ("Gracefully exiting... Remaining number of requests 1.", 1),  # no prefix at all
    ],
)
def test_sglang_s_drain_line_gives_its_count(line: str, count: int):
    assert remaining_requests(line) == count


@pytest.mark.parametrize(
    "line",
    [
        "",
        "[2026-12-01 12:00:00] SIGTERM received. signum=None frame=None. Draining requests and "
        "shutting down...",
        "[2026-12-01 12:00:00] Gracefully exiting... Remaining number of requests many.",
        "[2026-12-01 12:00:00] Gracefully exiting... Remaining number of requests 7",  # no "."
        "[2026-12-01 12:00:00] Gracefully exiting... Remaining number of requests "
        + "9" * 12
        + ".",  # not a count SGLang prints
        "[2026-12-01 12:00:00] Prefill batch. #new-seq: 1, #new-token: 8",
    ],
)
def test_other_lines_give_none(line: str):
    assert remaining_requests(line) is None


def test_the_count_is_read_only_where_a_message_starts_whatever_the_line_s_length():
    """A client's prompt echoed in a log line (--log-requests) may hold the phrase anywhere;
    only a line that starts with it counts, and a megabyte of one word is one bounded look."""
    assert remaining_requests("x" * 1_000_000) is None
    assert remaining_requests("字" * 200_000) is None
    deep = "[2026-12-01 12:00:00] Receive: text='" + "x" * 10_000 + SGLANG_LINE
    assert remaining_requests(deep) is None
    assert remaining_requests(SGLANG_LINE + "9" * 1_000_000) == 3


def test_the_drain_log_keeps_the_last_count_of_this_drain_only():
    log = DrainLog()
    assert log.since(0.0) is None
    log.feed("[t] loading weights", 1.0)
    log.feed(SGLANG_LINE, 10.0)
    log.feed("[t] Gracefully exiting... Remaining number of requests 1. Remaining requests", 15.0)
    log.feed("[t] Prefill batch", 16.0)
    assert log.since(12.0) == Remaining(1, 15.0)
    assert log.since(15.5) is None  # a count from before this drain's SIGTERM is not its own
