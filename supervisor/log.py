"""structlog setup: key-value on a terminal, journal lines (syslog priority, a sentence,
key=value) when stderr is the journal, JSON lines otherwise; the event tap and secret masking."""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, TextIO

import structlog

from supervisor.core.clip import clip
from supervisor.core.log_text import (
    journal_line,
    journal_stream_matches,
    priority,
    raw_server_line,
)
from supervisor.core.redact import Redactor

# Every event, and every state or incident file, passes through this: the secrets `run` knows
# (API keys, the values of secret-named variables of its environment and the server's) and the
# shapes of the ones it does not (core/redact.py). Replaced by register_secrets.
_redactor = Redactor()
# A string value longer than this is cut (head and tail kept) before it is masked: a value a
# client sent, or a traceback, must not make a log call's work grow without bound. Four times a
# server line (adapters/output_lines.py), so that a line is never cut twice.
MAX_VALUE_CHARS = 64 << 10


def register_secrets(values: Iterable[str]) -> None:
    """The secret values to mask from now on, everywhere this module scrubs."""
    global _redactor  # one process-wide set, read by every thread's log calls
    _redactor = Redactor(values)


def scrub(value: Any) -> Any:
    """`value` with every string in it (nested lists and dicts included) cut to MAX_VALUE_CHARS
    and redacted."""
    if isinstance(value, str):
        return _redactor(clip(value, MAX_VALUE_CHARS))
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
        _sinks = tuple(s for s in _sinks if s != sink)  # a bound method: equal, not identical


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


FORMATS = ("auto", "console", "json", "journal")
SERVER_OUTPUTS = ("json", "raw")
_format: str | None = None  # as configured: "json" | "console" | "journal"; None: not yet


def configured_format() -> str | None:
    """How log events are rendered since configure_logging; None before it ran."""
    return _format


def is_structured() -> bool:
    """Every line is an event (JSON or the journal's): no plain text may go to stderr."""
    return _format in ("json", "journal")


def stream_is_journal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """True when `stream` is connected to the journal: JOURNAL_STREAM names its device and
    inode (systemd.exec(5)); a stream redirected elsewhere by the service does not match."""
    env = os.environ if environ is None else environ
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False  # no descriptor (a StringIO), or a closed one
    return journal_stream_matches(env.get("JOURNAL_STREAM"), st.st_dev, st.st_ino)


def resolve_format(fmt: str, stream: TextIO, environ: Mapping[str, str] | None = None) -> str:
    """The format `fmt` means on `stream`: "auto" is console on a terminal, journal when the
    stream is the journal, JSON otherwise."""
    if fmt != "auto":
        return fmt
    if stream.isatty():
        return "console"
    return "journal" if stream_is_journal(stream, environ) else "json"


def _console_view(event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """On a terminal the pre-flight's table is printed where it matters (a refusal): its event
    shows the verdict, the sizes and what failed, not the whole schema."""
    if event.get("event") != "preflight_report":
        return event
    kept = ("event", "level", "timestamp", "verdict", "host_required_bytes", "host_budget_bytes")
    view = {k: event[k] for k in kept if k in event}
    checks = event.get("checks") or []
    view["failed"] = [c.get("name") for c in checks if c.get("status") == "fail"]
    return view


def _renderer(fmt: str, out: TextIO, server_output: str) -> Processor:
    """The last processor: the event as one line (the journal's may carry a traceback below)."""
    journal = stream_is_journal(out)
    json_render = structlog.processors.JSONRenderer()
    # https://no-color.org: NO_COLOR set to anything but "" turns colours off on a terminal too.
    colors = out.isatty() and not os.environ.get("NO_COLOR")
    console = structlog.dev.ConsoleRenderer(colors=colors)

    def render(logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        if server_output == "raw" and event.get("event") == "server_output":
            return raw_server_line(str(event.get("line", "")))
        if fmt == "journal":
            return journal_line(event)
        if fmt == "console":
            # A copy: ConsoleRenderer pops keys, and a sink may still hold this event.
            return console(logger, method, dict(_console_view(event)))
        line = str(json_render(logger, method, event))
        # JSON lines into the journal: journald takes the priority and strips the prefix, so
        # `journalctl -o cat | jq` still reads pure JSON and `-p err` finds the errors.
        return f"<{priority(str(event.get('level', method)))}>{line}" if journal else line

    return render


def configure_logging(
    fmt: str = "auto",
    level: str = "info",
    stream: TextIO | None = None,
    *,
    server_output: str = "json",
) -> None:
    """Route every log event to `stream` (stderr) as console key-values, JSON lines or journal
    lines (resolve_format). `server_output` "raw" writes SGLang's lines as they came, prefixed;
    they are events all the same, so the sinks see them.
    """
    global _format
    out = stream or sys.stderr
    fmt = resolve_format(fmt, out)
    _format = fmt
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _scrub_event,
            _tap,
            _level_filter(_LEVELS[level.lower()]),
            _renderer(fmt, out, server_output),
        ],
        # Every level reaches the processors (the tap); _level_filter drops what is not shown.
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("urllib3").setLevel(logging.WARNING)
