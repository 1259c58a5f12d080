"""structlog setup: key-value on a terminal, JSON lines otherwise (journald-friendly)."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, TextIO

import structlog

from supervisor.core.redact import Redactor

# Every event, and every state or incident file, passes through this: the secrets `run` knows
# (API keys, the values of secret-named variables of its environment and the server's) and the
# shapes of the ones it does not (core/redact.py). Replaced by register_secrets.
_redactor = Redactor()


def register_secrets(values: Iterable[str]) -> None:
    """The secret values to mask from now on, everywhere this module scrubs."""
    global _redactor  # one process-wide set, read by every thread's log calls
    _redactor = Redactor(values)


def scrub(value: Any) -> Any:
    """`value` with every string in it (nested lists and dicts included) redacted."""
    if isinstance(value, str):
        return _redactor(value)
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(scrub(v) for v in value)
    return value


def _scrub_event(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    return {key: scrub(value) for key, value in event.items()}


# The event tap: every event, whatever its level, after masking, goes to each sink (the status
# file, the metrics, the hooks). The log is the one record of what happened; what is derived from
# it (status, metrics) cannot disagree with it.
Sink = Callable[[Mapping[str, Any]], None]
_sinks: tuple[Sink, ...] = ()
_sinks_lock = threading.Lock()
sink_errors = 0  # exceptions raised by sinks (swallowed: a sink must never break a log call)


def add_sink(sink: Sink) -> None:
    """Pass every event from now on to `sink` (synchronously, in the logging thread)."""
    global _sinks
    with _sinks_lock:
        _sinks = (*_sinks, sink)


def remove_sink(sink: Sink) -> None:
    global _sinks
    with _sinks_lock:
        _sinks = tuple(s for s in _sinks if s is not sink)


def _tap(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    global sink_errors
    for sink in _sinks:  # a tuple replaced whole: iterating needs no lock
        try:
            sink(event)
        except Exception:  # noqa: BLE001 - a broken sink must not take logging down with it
            sink_errors += 1
    return event


Processor = Callable[[Any, str, MutableMapping[str, Any]], Mapping[str, Any]]
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}


def _level_filter(minimum: int) -> Processor:
    """Drop events below `minimum`, after the tap: sinks see debug events too."""

    def keep(_logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        if _LEVELS.get(method, 20) < minimum:
            raise structlog.DropEvent
        return event

    return keep


_format: str | None = None  # as configured: "json" | "console"; None: not yet


def configured_format() -> str | None:
    """How log events are rendered since configure_logging; None before it ran."""
    return _format


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Route every log event to `stream` (stderr) as console key-values or JSON lines.

    "auto" renders for a human when the stream is a TTY and as JSON otherwise.
    """
    global _format
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    _format = fmt
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=out.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _scrub_event,
            _tap,
            _level_filter(_LEVELS[level.lower()]),
            renderer,
        ],
        # Every level reaches the processors (the tap); _level_filter drops what is not shown.
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("urllib3").setLevel(logging.WARNING)
