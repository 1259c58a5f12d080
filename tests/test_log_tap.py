"""supervisor.log: the event tap sees every event, masked, whatever the shown level."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import structlog

from supervisor import log as sup_log


@pytest.fixture
def captured() -> Iterator[tuple[list[dict[str, Any]], io.StringIO]]:
    seen: list[dict[str, Any]] = []

    def sink(event: Mapping[str, Any]) -> None:
        seen.append(dict(event))

    stream = io.StringIO()
    sup_log.configure_logging("json", "warning", stream=stream)
    sup_log.add_sink(sink)
    try:
        yield seen, stream
    finally:
        sup_log.remove_sink(sink)
        sup_log.register_secrets(())


def test_sinks_see_events_below_the_shown_level_and_the_stream_does_not(
    captured: tuple[list[dict[str, Any]], io.StringIO],
) -> None:
    seen, stream = captured
    logger = structlog.get_logger("t")
    logger.debug("probe", n=1)
    logger.info("ready", n=2)
    logger.error("fatal", n=3)
    assert [(e["event"], e["level"]) for e in seen] == [
        ("probe", "debug"),
        ("ready", "info"),
        ("fatal", "error"),
    ]
    shown = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert shown == ["fatal"]


def test_sinks_get_secrets_masked(captured: tuple[list[dict[str, Any]], io.StringIO]) -> None:
    seen, _ = captured
    sup_log.register_secrets(["hf_supersecret_value"])
    structlog.get_logger("t").info("server_output", line="token hf_supersecret_value here")
    assert seen[-1]["line"] == "token *** here"


def test_a_failing_sink_neither_breaks_logging_nor_the_other_sinks(
    captured: tuple[list[dict[str, Any]], io.StringIO],
) -> None:
    seen, stream = captured

    def broken(_event: Mapping[str, Any]) -> None:
        raise RuntimeError("boom")

    before = sup_log.sink_errors
    sup_log.add_sink(broken)
    try:
        structlog.get_logger("t").error("fatal", reason="x")
    finally:
        sup_log.remove_sink(broken)
    assert sup_log.sink_errors == before + 1
    assert seen[-1]["event"] == "fatal"
    assert json.loads(stream.getvalue().splitlines()[-1])["reason"] == "x"


def test_a_huge_value_is_cut_before_it_is_masked(
    captured: tuple[list[dict[str, Any]], io.StringIO],
) -> None:
    """A client's megabyte value costs a bounded log call: head and tail kept, the cut said."""
    seen, _stream = captured
    sup_log.register_secrets(["hf_supersecret_value"])
    value = "hf_supersecret_value " + "x" * (1 << 20) + " api_key='tail-secret'"
    structlog.get_logger("t").warning("client_said", what=value, nested={"list": [value]})
    (event,) = seen
    for shown in (event["what"], event["nested"]["list"][0]):
        assert len(shown) < sup_log.MAX_VALUE_CHARS + 40
        assert shown.startswith("*** xxx")
        assert shown.endswith("api_key='***'")
        assert f"[cut {len(value) - sup_log.MAX_VALUE_CHARS} chars]" in shown
