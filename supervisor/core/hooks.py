"""Notification hooks (pure): which log event calls which hook, and the hook's argv with its
placeholders filled in.

`ready` calls `on_ready`, `fatal` calls `on_fatal`, `incident_written` calls `on_incident`.
Each argument of the command is filled in on its own (no shell ever reads it):
`{incident_file}` (the incident's path, empty for the other hooks), `{instance}` (the
instance name) and `{kind}` (`ready`; the exit code's name for a fatal end, e.g. `crash_loop`;
the incident's kind, e.g. `memory_kill`).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PLACEHOLDERS = ("incident_file", "instance", "kind")
HOOK_OF_EVENT = {"ready": "on_ready", "fatal": "on_fatal", "incident_written": "on_incident"}


def placeholder_problem(words: Sequence[str]) -> str | None:
    """Why `words` cannot be filled in (an unknown or malformed placeholder), or None."""
    for word in words:
        try:
            fields = [name for _text, name, _spec, _conv in string.Formatter().parse(word)]
        except ValueError as exc:
            return f"{word!r}: {exc} (write {{{{ and }}}} for a literal brace)"
        unknown = [name for name in fields if name is not None and name not in PLACEHOLDERS]
        if unknown:
            known = ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)
            return f"{word!r}: unknown placeholder {{{unknown[0]}}} (known: {known})"
    return None


@dataclass(frozen=True, slots=True)
class HookCall:
    hook: str  # on_ready | on_fatal | on_incident
    argv: tuple[str, ...]


def hook_call(
    event: Mapping[str, Any],
    commands: Mapping[str, Sequence[str]],
    instance: str,
    exit_names: Mapping[int, str],
) -> HookCall | None:
    """The hook `event` calls, its argv filled in; None when it calls none (or none is set)."""
    hook = HOOK_OF_EVENT.get(str(event.get("event")))
    command = commands.get(hook) if hook is not None else None
    if hook is None or not command:
        return None
    if hook == "on_ready":
        kind = "ready"
    elif hook == "on_fatal":
        code = event.get("exit_code")
        kind = exit_names.get(code, "fatal") if isinstance(code, int) else "fatal"
    else:
        kind = str(event.get("kind") or "incident")
    fields = {
        "incident_file": str(event.get("path") or "") if hook == "on_incident" else "",
        "instance": instance,
        "kind": kind,
    }
    return HookCall(hook, tuple(word.format(**fields) for word in command))
