"""structlog setup: key-value on a terminal, JSON lines otherwise (journald-friendly)."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Route every log event to `stream` (stderr) as console key-values or JSON lines.

    "auto" renders for a human when the stream is a TTY and as JSON otherwise.
    """
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
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
