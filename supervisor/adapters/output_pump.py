"""The server's merged stdout/stderr, read line by line without ever blocking the server."""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable
from typing import IO

from supervisor.adapters.output_lines import output_lines


class OutputPump:
    """Reads the server's merged stdout/stderr line by line and never blocks the server.

    The reader thread only reads, counts, redacts and keeps the tail; lines go to `sink` through a
    bounded queue drained by a second thread, so a slow log consumer (journald) drops lines
    (counted) instead of filling the pipe and stalling SGLang. The queue is bounded in lines and
    in characters: lines are cut to 16 KiB where they are read (adapters/output_lines.py), and
    10,000 of them would still be 160 MiB.

    Nothing here is held while a line is parsed or masked: the lock only guards the tail's
    append and copy, so `tail()` (the death classification, an incident) never waits on a line.
    """

    def __init__(
        self,
        stream: IO[bytes],
        sink: Callable[[str], None],
        redact: Callable[[str], str],
        tail_lines: int = 200,
        queue_lines: int = 10_000,
        queue_chars: int = 4 << 20,
    ) -> None:
        self._stream = stream
        self._sink = sink
        self._redact = redact
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=queue_lines)
        self._lock = threading.Lock()
        self.lines = 0
        self.dropped = 0
        self._queue_chars = queue_chars
        # Characters put in (by the reader) and taken out (by the writer): each counter has one
        # writing thread, so their difference needs no lock.
        self._chars_in = 0
        self._chars_out = 0
        self._reader = threading.Thread(target=self._read, name="server-output", daemon=True)
        self._writer = threading.Thread(target=self._write, name="server-log", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def _read(self) -> None:
        try:
            for raw in output_lines(self._stream):  # a tqdm redraw ("\r") is a line too
                line = self._redact(raw.decode("utf-8", errors="replace"))
                with self._lock:
                    self._tail.append(line)
                    self.lines += 1
                if self._chars_in - self._chars_out + len(line) > self._queue_chars:
                    self.dropped += 1
                    continue
                try:
                    self._queue.put_nowait(line)
                    self._chars_in += len(line)
                except queue.Full:
                    self.dropped += 1
        finally:
            self._stream.close()
            self._queue.put(None)

    def _write(self) -> None:
        while (line := self._queue.get()) is not None:
            self._chars_out += len(line)
            self._sink(line)

    def tail(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._tail)

    def join(self, timeout_s: float) -> None:
        """Wait for the output to be drained (the pipe closes when the last writer exits)."""
        self._reader.join(timeout_s)
        self._writer.join(timeout_s)
