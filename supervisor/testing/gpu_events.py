"""The simulated driver's event queue (FAKE_GPU_STATE_DIR/events.jsonl), as NVML delivers events.

One line per event, appended: {"gpu", "type", "data", "at"}; `type` is a pynvml nvmlEventType*
bit, `data` the event's eventData (the Xid for an Xid, the recovery action for
nvmlEventTypeGpuRecoveryAction, else 0), `at` the wall clock. Append-only, so a reader (an event
set in fake_nvml) keeps a byte offset: every reader sees every later event once, and one that
started reading after an event never sees it, as NVML delivers only events registered for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml

from supervisor.testing import gpu_state

LOCK_FILE = "faults.lock"

# pynvml's nvmlEventType* names of the events the simulated driver can deliver.
SUPPORTED_EVENT_TYPES = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeGpuRecoveryAction
)


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Hold the state dir's fault lock (writers of health files and the queue take it)."""
    with (state_dir / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def append_event(state_dir: Path, gpu_index: int, event_type: int, data: int = 0) -> None:
    """Queue one driver event (a single O_APPEND write of one line, under the lock)."""
    line = json.dumps({"gpu": gpu_index, "type": event_type, "data": data, "at": time.time()})
    with locked(state_dir):
        fd = os.open(state_dir / gpu_state.EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class SimEvent:
    gpu_index: int
    event_type: int
    data: int
    end_offset: int  # where the next event starts: a reader's new position


def events_end(state_dir: Path) -> int:
    """The queue's current end: a reader starting here sees only later events."""
    try:
        return (state_dir / gpu_state.EVENTS_FILE).stat().st_size
    except OSError:
        return 0


def read_events(state_dir: Path, offset: int) -> list[SimEvent]:
    """The complete events queued at or after byte `offset` (a line still being written waits)."""
    try:
        with (state_dir / gpu_state.EVENTS_FILE).open("rb") as queue:
            queue.seek(offset)
            chunk = queue.read()
    except OSError:
        return []
    events: list[SimEvent] = []
    for line in chunk.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        offset += len(line)
        try:
            raw = json.loads(line)
            events.append(SimEvent(int(raw["gpu"]), int(raw["type"]), int(raw["data"]), offset))
        except (ValueError, KeyError, TypeError):
            continue  # a damaged line is skipped, never delivered half
    return events
