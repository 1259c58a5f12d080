"""supervisor.log: journal lines with syslog priorities, the JOURNAL_STREAM match, JSON with
a priority only into the journal, and SGLang's lines raw: still events for the sinks."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import pytest
import structlog

from supervisor import log as sup_log


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    sup_log.register_secrets(())
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def journal_env(stream: TextIO) -> dict[str, str]:
    st = os.fstat(stream.fileno())
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def log_each_level() -> None:
    logger = structlog.get_logger("t")
    logger.debug("probe")
    logger.info("ready")
    logger.warning("memory_warn", reason="host memory low")
    logger.error("fatal", exit_code=1, reason="the pre-flight refuses this launch")
    logger.critical("fatal", exit_code=6, reason="GPUs not released")


def test_journal_lines_carry_the_priority_of_their_level() -> None:
    stream = io.StringIO()
    sup_log.configure_logging("journal", "debug", stream=stream)
    log_each_level()
    assert stream.getvalue().splitlines() == [
        "<7>probe",
        "<6>server ready",
        "<4>memory low: host memory low",
        "<3>fatal: the pre-flight refuses this launch exit_code=1",
        "<3>fatal: GPUs not released exit_code=6",
    ]
    assert sup_log.configured_format() == "journal"
    assert sup_log.is_structured()


def test_the_level_filter_applies_to_journal_lines_too() -> None:
    stream = io.StringIO()
    sup_log.configure_logging("journal", "warning", stream=stream)
    log_each_level()
    assert [line[:3] for line in stream.getvalue().splitlines()] == ["<4>", "<3>", "<3>"]


def test_journal_stream_matches_the_file_it_names_and_no_other(tmp_path: Path) -> None:
    with (tmp_path / "journal").open("w") as journal, (tmp_path / "elsewhere").open("w") as other:
        env = journal_env(journal)
        assert sup_log.stream_is_journal(journal, env)
        assert not sup_log.stream_is_journal(other, env)  # stderr redirected by the unit
        assert sup_log.resolve_format("auto", journal, env) == "journal"
        assert sup_log.resolve_format("auto", other, env) == "json"
        assert sup_log.resolve_format("auto", journal, {}) == "json"
        assert sup_log.resolve_format("console", journal, env) == "console"
    assert not sup_log.stream_is_journal(io.StringIO(), env)  # no descriptor at all


def test_stderr_is_the_journal_only_when_journal_stream_names_its_own_descriptor(
    tmp_path: Path,
) -> None:
    with os.fdopen(os.dup(2), "w") as stderr, (tmp_path / "f").open("w") as file:
        assert sup_log.stream_is_journal(stderr, journal_env(stderr))
        assert not sup_log.stream_is_journal(stderr, journal_env(file))


def test_auto_renders_journal_lines_into_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal"
    with path.open("w") as journal:
        monkeypatch.setenv("JOURNAL_STREAM", journal_env(journal)["JOURNAL_STREAM"])
        sup_log.configure_logging("auto", "info", stream=journal)
        log_each_level()
    assert sup_log.configured_format() == "journal"
    assert path.read_text().splitlines()[0] == "<6>server ready"


def test_json_into_the_journal_carries_the_priority_journald_strips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal"
    with path.open("w") as journal:
        monkeypatch.setenv("JOURNAL_STREAM", journal_env(journal)["JOURNAL_STREAM"])
        sup_log.configure_logging("json", "info", stream=journal)
        log_each_level()
    lines = path.read_text().splitlines()
    assert [line[:3] for line in lines] == ["<6>", "<4>", "<3>", "<3>"]
    assert [json.loads(line[3:])["event"] for line in lines] == [
        "ready",
        "memory_warn",
        "fatal",
        "fatal",
    ]


def test_json_elsewhere_is_pure_json_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    path = tmp_path / "log"
    with path.open("w") as out:
        sup_log.configure_logging("json", "info", stream=out)
        log_each_level()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["event"], e["level"]) for e in events][:2] == [
        ("ready", "info"),
        ("memory_warn", "warning"),
    ]


@pytest.mark.parametrize("fmt", ["json", "journal", "console"])
def test_raw_server_output_is_the_line_masked_and_prefixed_and_still_an_event(fmt: str) -> None:
    seen: list[dict[str, Any]] = []

    def sink(event: Mapping[str, Any]) -> None:
        seen.append(dict(event))

    stream = io.StringIO()
    sup_log.configure_logging(fmt, "info", stream=stream, server_output="raw")
    sup_log.register_secrets(["hf_rawsecret_value"])
    sup_log.add_sink(sink)
    try:
        logger = structlog.get_logger("t").bind(run_id="r1", server_pid=7)
        logger.info("server_output", line='{"not": "ours"} token=hf_rawsecret_value')
        logger.info("ready")
    finally:
        sup_log.remove_sink(sink)
    first, second = stream.getvalue().splitlines()
    assert first == '[sglang] {"not": "ours"} token=***'
    assert "ready" in second
    assert not second.startswith("[sglang]")
    assert seen[0]["event"] == "server_output"
    assert seen[0]["line"] == '{"not": "ours"} token=***'
    assert (seen[0]["run_id"], seen[0]["server_pid"]) == ("r1", 7)


def test_json_server_output_stays_an_event_line() -> None:
    stream = io.StringIO()
    sup_log.configure_logging("json", "info", stream=stream)
    structlog.get_logger("t").info("server_output", line="Load weight begin")
    assert json.loads(stream.getvalue())["line"] == "Load weight begin"


def test_console_is_not_structured() -> None:
    sup_log.configure_logging("console", "info", stream=io.StringIO())
    assert not sup_log.is_structured()


def test_on_a_console_the_preflight_report_is_its_verdict_not_the_whole_schema() -> None:
    seen: list[dict[str, Any]] = []

    def sink(event: Mapping[str, Any]) -> None:
        seen.append(dict(event))

    stream = io.StringIO()
    sup_log.configure_logging("console", "info", stream=stream)
    sup_log.add_sink(sink)
    try:
        structlog.get_logger("t").warning(
            "preflight_report",
            verdict="no-fit",
            host_required_bytes=2,
            host_budget_bytes=1,
            arithmetic=[{"term": "usable", "bytes": 1}],
            checks=[{"name": "host_memory", "status": "fail", "detail": "short"}],
        )
    finally:
        sup_log.remove_sink(sink)
    line = stream.getvalue()
    assert "verdict=no-fit" in line
    assert "failed=['host_memory']" in line
    assert "arithmetic" not in line
    assert seen[0]["arithmetic"] == [{"term": "usable", "bytes": 1}]  # the sinks get it all
