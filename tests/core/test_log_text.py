"""core.log_text: events as journal lines (priority, sentence, key=value), pure."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.log_text import (
    field_value,
    journal_line,
    journal_stream_matches,
    priority,
    raw_server_line,
    sentence,
)
from supervisor.core.units import GiB


def event(name: str, level: str = "info", **fields: Any) -> dict[str, Any]:
    return {"event": name, "level": level, "timestamp": "2025-01-01T00:00:00Z", **fields}


@pytest.mark.parametrize(
    ("level", "expected"),
    [("critical", 3), ("error", 3), ("warning", 4), ("info", 6), ("debug", 7), ("odd", 6)],
)
def test_levels_map_to_syslog_priorities(level: str, expected: int) -> None:
    assert priority(level) == expected
    assert journal_line(event("ready", level)).startswith(f"<{expected}>")


def test_documented_events_read_as_sentences_that_do_not_repeat_their_fields() -> None:
    line = journal_line(
        event(
            "restarting",
            failure="rank_crash",
            delay_s=10.0,
            attempt=2,
            restart_count=3,
            run_id="abc",
            server_pid=42,
        )
    )
    assert line == (
        "<6>restarting after rank_crash in 10 s attempt=2 restart_count=3 run_id=abc server_pid=42"
    )
    assert journal_line(event("ready")) == "<6>server ready"


def test_an_unknown_event_or_one_missing_a_field_reads_as_its_name_with_every_field() -> None:
    assert journal_line(event("brand_new", x=1)) == "<6>brand_new x=1"
    # `restarting` without its delay: no half-filled sentence, nothing lost.
    assert journal_line(event("restarting", failure="rank_crash")) == (
        "<6>restarting failure=rank_crash"
    )


def test_sizes_read_with_units_in_the_sentence() -> None:
    text, used = sentence(
        event("memory_report", available_bytes=136_517_718_638, tree_charged_bytes=5 * GiB)
    )
    assert text == "memory: 127.1 GiB available, server tree 5.0 GiB"
    assert used == {"available_bytes", "tree_charged_bytes"}


def test_watchdog_limits_name_the_kill_lines_with_units() -> None:
    limits = event(
        "watchdog_limits",
        tree_budget_bytes=None,
        tree_kill_bytes=None,
        kill_available_bytes=2 * GiB,
        kill_available_percent=2.0,
    )
    assert journal_line(limits) == (
        "<6>memory watchdog kills below 2.0 GiB or 2 % available; the server tree has no budget"
        " (no pre-flight report)"
    )
    budgeted = {**limits, "tree_budget_bytes": 400 * GiB, "tree_kill_bytes": 440 * GiB}
    assert journal_line({**budgeted, "kill_available_percent": None}) == (
        "<6>memory watchdog kills below 2.0 GiB available, or when the server tree passes "
        "440.0 GiB (budget 400.0 GiB)"
    )


def test_a_cut_drain_says_how_many_requests_it_cut_or_that_sglang_had_not_counted() -> None:
    cut = event("drain_cut", "warning", grace_s=60.0, drained_s=60.05, counted_after_s=55.0)
    assert journal_line({**cut, "remaining_requests": 2}) == (
        "<4>stop grace of 60 s ran out while the server drained: killed with 2 requests still in "
        "flight (SGLang's last count) drained_s=60.05 counted_after_s=55.0"
    )
    assert "with 1 request still" in journal_line({**cut, "remaining_requests": 1})
    assert journal_line({**cut, "remaining_requests": None, "counted_after_s": None}) == (
        "<4>stop grace of 60 s ran out while the server drained: killed before SGLang counted the "
        "requests in flight drained_s=60.05 counted_after_s=null"
    )


def test_the_preflight_report_names_its_verdict_and_failed_checks() -> None:
    checks = [
        {"name": "host_memory", "status": "fail", "detail": "short"},
        {"name": "shm", "status": "ok", "detail": "fine"},
    ]
    text, _ = sentence(
        event(
            "preflight_report",
            verdict="no-fit",
            host_required_bytes=600 * GiB,
            host_budget_bytes=400 * GiB,
            checks=checks,
        )
    )
    assert text == (
        "pre-flight: no-fit; the launch needs 600.0 GiB of 400.0 GiB host memory; "
        "failed: host_memory"
    )


def test_a_value_with_spaces_or_a_newline_stays_on_one_quoted_line() -> None:
    line = journal_line(event("fatal", "error", reason="no fit", exit_code=1, detail="a\nb c"))
    assert line == '<3>fatal: no fit exit_code=1 detail="a\\nb c"'
    assert "\n" not in line


def test_a_traceback_follows_on_lines_of_the_same_priority() -> None:
    line = journal_line(event("internal_error", "error", exception="Traceback\n  File x\nBoom"))
    assert line.splitlines() == [
        "<3>internal error (a bug; traceback follows)",
        "<3>Traceback",
        "<3>  File x",
        "<3>Boom",
    ]


def test_sglang_lines_are_the_line_itself_without_the_run_fields() -> None:
    line = journal_line(event("server_output", line="Load weight end.", run_id="r", server_pid=1))
    assert line == "<6>[sglang] Load weight end."
    assert raw_server_line("x = 1") == "[sglang] x = 1"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ("", '""'),
        ('say "hi"', '"say \\"hi\\""'),
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (1.5, "1.5"),
        ([1, "a"], '[1,"a"]'),
        ({"k": 1}, '{"k":1}'),
    ],
)
def test_field_values(value: Any, text: str) -> None:
    assert field_value(value) == text


@pytest.mark.parametrize(
    ("journal_stream", "matches"),
    [
        ("2049:131074", True),
        (" 2049:131074\n", True),
        ("2049:131075", False),
        ("2050:131074", False),
        ("2049", False),
        ("a:b", False),
        ("", False),
        (None, False),
    ],
)
def test_journal_stream_names_one_device_and_inode(
    journal_stream: str | None, matches: bool
) -> None:
    assert journal_stream_matches(journal_stream, 2049, 131074) is matches
