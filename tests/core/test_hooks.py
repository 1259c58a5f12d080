"""core.hooks: which event calls which hook, the placeholders filled in per argument, and the
placeholders refused."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from supervisor.core.hooks import HookCall, hook_call, placeholder_problem

COMMANDS = {
    "on_ready": ("notify", "{instance} is {kind}"),
    "on_fatal": ("page", "{kind}", "{incident_file}"),
    "on_incident": ("mail", "--file={incident_file}", "{kind}"),
}
EXITS = {5: "crash_loop"}


def call(event: Mapping[str, object]) -> HookCall | None:
    return hook_call(event, COMMANDS, "qwen", EXITS)


def test_ready_fatal_and_an_incident_call_their_hooks_with_the_fields_filled_in() -> None:
    assert call({"event": "ready"}) == HookCall("on_ready", ("notify", "qwen is ready"))
    assert call({"event": "fatal", "exit_code": 5}) == HookCall(
        "on_fatal", ("page", "crash_loop", "")
    )
    incident = {"event": "incident_written", "kind": "memory_kill", "path": "/s/incident-1.json"}
    assert call(incident) == HookCall(
        "on_incident", ("mail", "--file=/s/incident-1.json", "memory_kill")
    )


def test_an_unknown_exit_code_is_fatal_and_other_events_call_nothing() -> None:
    assert call({"event": "fatal", "exit_code": 99}) == HookCall("on_fatal", ("page", "fatal", ""))
    assert call({"event": "fatal"}) == HookCall("on_fatal", ("page", "fatal", ""))
    assert call({"event": "hook_failed"}) is None  # a hook's own events never call a hook
    assert call({"event": "server_output", "line": "ready"}) is None


def test_a_hook_that_is_not_set_is_not_called() -> None:
    assert hook_call({"event": "ready"}, {"on_ready": ()}, "qwen", EXITS) is None
    assert hook_call({"event": "ready"}, {}, "qwen", EXITS) is None


def test_a_value_with_braces_or_spaces_stays_one_argument() -> None:
    event = {"event": "incident_written", "kind": "x", "path": "/a b/{kind}.json"}
    argv = hook_call(event, {"on_incident": ("cat", "{incident_file}")}, "i", EXITS)
    assert argv == HookCall("on_incident", ("cat", "/a b/{kind}.json"))


@pytest.mark.parametrize(
    ("word", "why"),
    [
        ("{incidentfile}", "unknown placeholder {incidentfile}"),
        ("{}", "unknown placeholder {}"),
        ("{0}", "unknown placeholder {0}"),
        ("{kind.upper}", "unknown placeholder {kind.upper}"),
        ("{kind", "{{"),  # malformed: says how to write a literal brace
    ],
)
def test_unknown_or_malformed_placeholders_are_named(word: str, why: str) -> None:
    problem = placeholder_problem(("notify", word))
    assert problem is not None
    assert why in problem


def test_known_placeholders_and_literal_braces_pass() -> None:
    assert placeholder_problem(("x", "{instance}", "{kind}-{incident_file}", "{{json}}")) is None
