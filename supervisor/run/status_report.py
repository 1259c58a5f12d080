"""While `run` supervises: its status published as status.json (adapters/status_file.py, fed by
the log's event tap), and the load's progress told as it goes: in systemd's STATUS=, as a
`load_progress` event every 10 s, or on a terminal as a one-line bar (an event line of its own
every 2 s while it moves: no cursor tricks, so no log line is ever overwritten).

One thread, once a second: it flushes the status file's throttled writes and reports the load.
It logs from its own thread, where the runner's bound run_id and server_pid are not visible:
they are passed explicitly.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import structlog

from supervisor.adapters.background import Background
from supervisor.adapters.clock import SystemClock
from supervisor.adapters.status_file import StatusPublisher
from supervisor.config import RunSettings
from supervisor.core.ports import Clock, Notifier
from supervisor.core.status import LOADING_STATES, Status, systemd_line
from supervisor.errors import ExitCode, SupervisorError
from supervisor.log import add_sink, configured_format, remove_sink

log = structlog.get_logger("supervisor.run")

TICK_S = 1.0
EVENT_EVERY_S = 10.0  # a `load_progress` event while loading (not on a terminal)
BAR_EVERY_S = 2.0  # on a terminal: a new bar line at most this often, when it moved
STATUS_EVERY_S = 2.0  # STATUS= when the progress moved, at most this often (and every 10 s)


class LoadReporter(Background):
    """Tells the load's progress; `tick` once a second (the thread, or a test)."""

    thread_name = "status-report"

    def __init__(
        self, publisher: StatusPublisher, notifier: Notifier, clock: Clock, *, bar: bool
    ) -> None:
        self.publisher = publisher
        self.notifier = notifier
        self.clock = clock
        self.bar = bar
        self._run_id = ""
        # What was last told (phase, done, total), and when: told again when it moved.
        self._status_seen: tuple[object, ...] | None = None
        self._event_seen: tuple[object, ...] | None = None
        self._event_at = self._status_at = float("-inf")
        super().__init__()

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            self.tick()

    def tick(self) -> None:
        self.publisher.flush()
        status = self.publisher.snapshot()
        if status.server_state not in LOADING_STATES or status.load is None:
            return
        now = self.clock.monotonic()
        if status.run_id != self._run_id:  # a new launch: its first report 10 s from now
            self._run_id = status.run_id
            self._status_seen = self._event_seen = None
            self._event_at = self._status_at = now
        seen = (status.load.phase, status.load.done, status.load.total)
        since_status, since_event = now - self._status_at, now - self._event_at
        if since_status >= EVENT_EVERY_S or (
            seen != self._status_seen and since_status >= STATUS_EVERY_S
        ):
            self._status_at, self._status_seen = now, seen
            self.publisher.locked(self._send_status)
        if self.bar:
            due = seen != self._event_seen and since_event >= BAR_EVERY_S
        else:
            due = since_event >= EVENT_EVERY_S
        if due:
            self._event_at, self._event_seen = now, seen
            self._log(status)

    def _send_status(self, status: Status) -> None:
        """Under the publisher's lock: a newer state's STATUS= from the runner comes after."""
        if status.server_state in LOADING_STATES:
            self.notifier.status(systemd_line(status, self.clock.wall()))

    def _log(self, status: Status) -> None:
        load = status.load
        assert load is not None
        wall = self.clock.wall()
        ids: dict[str, Any] = {"run_id": status.run_id, "server_pid": status.server_pid}
        if self.bar:
            log.info("load_progress", bar=load.bar(wall), **ids)
            return
        eta = load.eta_s(wall)
        log.info(
            "load_progress",
            phase=load.phase.value,
            percent=None if load.percent is None else round(load.percent, 1),
            done=load.done,
            total=load.total,
            unit=load.unit or None,
            eta_s=None if eta is None else round(eta),
            elapsed_s=round(wall - load.started_at_s, 1),
            detail=load.describe(wall),
            **ids,
        )


@contextlib.contextmanager
def publishing_status(
    settings: RunSettings, notifier: Notifier, clock: Clock | None = None
) -> Iterator[StatusPublisher]:
    """status.json and the load's progress for as long as the block runs."""
    publisher = StatusPublisher(
        settings.state_dir,
        instance=settings.instance,
        restart_window_s=settings.run.restart_window_s,
    )
    bar = configured_format() == "console" and sys.stderr.isatty()
    reporter = LoadReporter(publisher, notifier, clock or SystemClock(), bar=bar)
    publisher.flush()  # "starting", before anything else happens
    sink = publisher.feed  # one bound method: remove_sink finds a sink by identity
    add_sink(sink)
    reporter.start()
    try:
        yield publisher
    except SupervisorError:
        raise  # the runner logged it as `fatal`: the status has it
    except Exception:
        reason = "internal error (a bug: the traceback is in the log)"
        publisher.feed(
            {"event": "internal_error", "exit_code": int(ExitCode.INTERNAL), "reason": reason}
        )
        raise
    finally:
        remove_sink(sink)
        reporter.stop()
        publisher.close()
