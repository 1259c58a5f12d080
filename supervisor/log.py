"""structlog setup: key-value on a terminal, JSON lines otherwise (journald-friendly)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping, MutableMapping
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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
            if hasattr(logging, "getLevelNamesMapping")
            else logging.getLevelName(level.upper())
        ),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("urllib3").setLevel(logging.WARNING)
