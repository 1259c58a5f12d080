"""The measured-sizing records of an instance: `measured-sizing.json` in its state directory.

`run` adds one after every launch that reached ready; the pre-flight of the same deployment
reads them. Written atomically; a missing or damaged file is no records (with a warning), never
a failed start.
"""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.atomic_file import open_regular
from supervisor.core.bounded import parse_json
from supervisor.core.measured import Record, add_record

FILE_NAME = "measured-sizing.json"
_VERSION = 1


def load_records(state_dir: Path) -> tuple[tuple[Record, ...], str | None]:
    """(the records in `state_dir`, why they could not be read or None). No file: no records."""
    path = state_dir / FILE_NAME
    try:
        # A FIFO put there must not block the pre-flight; a link there is not followed.
        with open_regular(path, follow_symlinks=False) as fh:
            data = parse_json(fh.read().decode("utf-8"))
        return tuple(Record.from_json(r) for r in data["records"]), None
    except FileNotFoundError:
        return (), None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return (), f"{path} unreadable, measurements ignored: {exc}"


def save_record(state_dir: Path, record: Record) -> None:
    """Add `record` (bounded per deployment and in all). A write error is logged, not raised:
    losing a measurement must not stop a running server's supervision."""
    # Only `run` saves: the pre-flight, which only loads, does not pay for structlog's import.
    import structlog

    from supervisor.atomic_file import write_text_atomic

    log = structlog.get_logger("supervisor.measured")
    records, problem = load_records(state_dir)
    if problem is not None:
        log.warning("measured_sizing_replaced", reason=problem)
    records = add_record(records, record)
    document = {"version": _VERSION, "records": [r.to_json() for r in records]}
    try:
        write_text_atomic(state_dir / FILE_NAME, json.dumps(document, indent=1) + "\n")
    except OSError as exc:
        log.warning("measured_sizing_not_saved", error=str(exc))
