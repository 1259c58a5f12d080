"""The GPU event watch while a server runs, and what follows a critical event.

Beside every launch a thread asks the NVML worker for driver events every `poll_s` (the worker
waits up to `wait_ms` for one: adapters/nvml_events.py), judges each (core/xid.py) and logs it
as `gpu_event`. The first event that calls for it on one of the server's GPUs (a critical Xid,
a double-bit ECC error, a lost GPU, a recovery action) SIGKILLs the whole group, writes a
`gpu_xid` incident and posts the kill on the runner's queue, which classifies the death
`gpu_xid` (restart) or `gpu_xid_fatal` (exit 6). A worse event of the same launch raises the
decision (the incident records it). Before the relaunch the GPU release wait resets the GPUs
whose event asks for a reset ([gpu] reset_command, run/gpu_wait.py) and checks them again; a
decision of reboot or drain ends the run with exit 6, also when the server died of the fault
before the event was read.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

import structlog

from supervisor.adapters.background import Background
from supervisor.adapters.clock import SystemClock
from supervisor.adapters.gpu_guard import GuardedGpuSensor
from supervisor.core.classify import FailureKind
from supervisor.core.events import Event, KillReason, MemoryAction, WatchdogEvent
from supervisor.core.gpu_health import EventKind, GpuEvent
from supervisor.core.ports import Clock, GpuSensor, ServerHandle
from supervisor.core.xid import Verdict, XidDecision, decide, worse
from supervisor.errors import GpuUnrecoverable
from supervisor.run.death import DeathReport
from supervisor.run.gpu_wait import GpuRelease
from supervisor.run.plugins import LaunchInfo, Plugins
from supervisor.run.state import StateStore

log = structlog.get_logger("supervisor.gpu_events")

POLL_S = 0.5
# Short: the worker holds the sensor's lock while it waits, and the load monitor reads through it.
WAIT_MS = 100
INCIDENT_KIND = "gpu_xid"

# wait_ms -> the driver events since the last call, None when NVML cannot say.
ReadEvents = Callable[[int], tuple[GpuEvent, ...] | None]


class IncidentFile(Protocol):
    """An incident report (supervisor/memory/incident.py) as this module writes to it."""

    @property
    def path(self) -> Path: ...

    def record_next(self, step: str, **data: Any) -> None: ...


# (summary, details) -> a new `gpu_xid` incident file, None when it could not be written.
OpenIncident = Callable[[str, Mapping[str, Any]], IncidentFile | None]


class GpuEventWatch(Background):
    """The component of one launch: a thread that reads the driver events and hands each on
    (`serving` False for the last read, after the stop: the tree is gone or going)."""

    thread_name = "gpu-events"
    stop_timeout_s = 10.0  # the NVML worker may be in its event wait

    def __init__(
        self,
        read_events: ReadEvents,
        on_event: Callable[[GpuEvent, bool], None],
        *,
        poll_s: float = POLL_S,
        wait_ms: int = WAIT_MS,
    ) -> None:
        self.read_events = read_events
        self.on_event = on_event
        self.poll_s = poll_s
        self.wait_ms = wait_ms
        super().__init__()

    def _loop(self) -> None:
        while True:
            self._poll(serving=True)
            if self._stop.wait(self.poll_s):
                break
        self._poll(serving=False)  # what arrived while the tree was dying: logged, kept

    def _poll(self, *, serving: bool) -> None:
        try:
            for event in self.read_events(self.wait_ms) or ():
                self.on_event(event, serving)
        except Exception:  # a bug must not end the watch silently
            log.exception("gpu_event_watch_failed")


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
    server: ServerHandle
    post: Callable[[Event], None]
    targets: frozenset[int]
    run_id: str


def event_dict(decision: XidDecision) -> dict[str, Any]:
    """One judged event as plain data (the incident file)."""
    event = decision.event
    return {
        "gpu": event.index,
        "uuid": event.uuid,
        "kind": event.kind.value,
        "xid": decision.xid,
        "meaning": decision.meaning,
        "recovery_action": decision.action_name,
        "decision": decision.verdict.value,
        "at": datetime.datetime.fromtimestamp(event.at_s, tz=datetime.timezone.utc).isoformat(),
    }


class GpuEventGuard:
    """The event watch's side of one `run`: a component per launch, a death hook (a reboot or
    drain ends the run) and a relaunch hook (the reset). Keeps the per-GPU Xid counts."""

    def __init__(
        self,
        store: StateStore,
        read_events: ReadEvents,
        open_incident: OpenIncident,
        *,
        clock: Clock | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.store = store
        self.read_events = read_events
        self.open_incident = open_incident
        self.clock = clock or SystemClock()
        self.poll_s = poll_s
        self.xid_counts: defaultdict[int, Counter[int]] = defaultdict(Counter)
        self._lock = threading.Lock()
        self._launch: _Launch | None = None
        self.decision: XidDecision | None = None  # the current launch's, the worst so far
        self.reset_gpus: set[int] = set()  # to reset before the relaunch
        self.incident: IncidentFile | None = None

    @property
    def plugins(self) -> Plugins:
        return Plugins(
            components=(self.watch_for,),
            death_hooks=(self.on_death,),
            relaunch_hooks=(self.before_relaunch,),
        )

    def watch_for(
        self, server: ServerHandle, post: Callable[[Event], None], info: LaunchInfo
    ) -> GpuEventWatch:
        """Component factory: one watch per launched server, on the GPUs of its plan."""
        with self._lock:
            if self.incident is not None:
                self.incident.record_next("relaunched", server_pid=server.pid, run_id=info.run_id)
            self.incident, self.decision = None, None
            self.reset_gpus = set()
            targets = frozenset(info.plan.local_gpu_ids())
            self._launch = _Launch(server, post, targets, info.run_id)
        return GpuEventWatch(self.read_events, self.on_event, poll_s=self.poll_s)

    def on_event(self, event: GpuEvent, serving: bool) -> None:
        """Judge, count and log one event; act on the first that calls for it."""
        launch = self._launch
        if launch is None:
            return
        decision = decide(event, launch.targets)
        with self._lock:
            count = None
            if event.kind is EventKind.XID:
                self.xid_counts[event.index][event.code] += 1
                count = self.xid_counts[event.index][event.code]
            before = self.decision
            if decision.verdict.kills:
                self.decision = worse(before, decision)
            if decision.verdict is Verdict.RESET:
                self.reset_gpus.add(event.index)
            now_followed = self.decision is decision
            incident = self.incident
        _log_event(decision, count)
        if now_followed and before is None:
            self._act(launch, decision, serving)
        elif now_followed and incident is not None:
            incident.record_next("escalated", gpu_event=event_dict(decision))

    def _act(self, launch: _Launch, decision: XidDecision, serving: bool) -> None:
        """Write the incident, kill the group (while it serves), tell the run loop. The
        incident first: a death the runner sees at once finds it (a death hook records in it)."""
        kind = FailureKind.GPU_XID_FATAL if decision.verdict.ends_run else FailureKind.GPU_XID
        reason = decision.reason()
        gpu = decision.event.index
        incident = self.open_incident(
            reason,
            {
                "gpu_event": event_dict(decision),
                "xid_counts": {str(x): n for x, n in sorted(self.xid_counts[gpu].items())},
                "run_id": launch.run_id,
                "server_pid": launch.server.pid,
                "pid": os.getpid(),
            },
        )
        with self._lock:
            self.incident = incident
        if not serving:
            return  # the tree is gone already: what follows is the relaunch hook's
        pids = launch.server.kill_all(KillReason(kind, reason))
        launch.post(
            WatchdogEvent(
                action=MemoryAction.KILLED,
                failure=kind,
                reason=reason,
                at_s=self.clock.monotonic(),
                pids=pids,
                incident_path=str(incident.path) if incident is not None else None,
            )
        )

    def on_death(self, report: DeathReport) -> None:
        """Death hook: note the classification; a reboot or drain ends the run now, even when
        the death was classified otherwise (the fault came first, or worsened after the kill)."""
        with self._lock:
            decision, incident = self.decision, self.incident
        if decision is None:
            return
        if incident is not None:
            incident.record_next(
                "classified", failure=report.classification.kind.value, pids=list(report.pids)
            )
        if (
            decision.verdict.ends_run
            and report.classification.kind is not FailureKind.GPU_XID_FATAL
        ):
            self._end_run(decision)

    def before_relaunch(self, release: GpuRelease, pids: Sequence[int], clock: Clock) -> None:
        """Relaunch hook (before the runner's GPU release wait): end the run on a reboot or
        drain decision; wait for the GPUs here, resetting those an event asked a reset for."""
        with self._lock:
            decision, gpus = self.decision, sorted(self.reset_gpus)
            self.reset_gpus = set()
        if decision is None:
            return
        if decision.verdict.ends_run:
            self._end_run(decision)
        if not gpus:
            return
        if release.resetter is None:
            listed = ", ".join(str(i) for i in gpus)
            self._end_run(
                decision,
                f"{decision.what()} needs a GPU reset and [gpu] reset_command is not set: "
                f"reset GPU {listed} (nvidia-smi --gpu-reset -i N) and start again",
            )
        if self.incident is not None:
            self.incident.record_next("gpu_reset", gpus=gpus)
        # The release wait frees the GPUs, resets them (peer sets, preconditions) and checks
        # them again; a failed reset ends the run there (exit 6).
        release.wait(pids, clock, reset=gpus)

    def _end_run(self, decision: XidDecision, message: str | None = None) -> NoReturn:
        """Raises GpuUnrecoverable (exit 6), the failure filed in the state file first."""
        reason = message or decision.reason()
        self.store.update(
            lambda s: dataclasses.replace(
                s, last_failure=FailureKind.GPU_XID_FATAL.value, last_failure_hint=reason
            )
        )
        if self.incident is not None:
            self.incident.record_next("not_relaunched", reason=reason)
        raise GpuUnrecoverable(reason)


def _log_event(decision: XidDecision, count: int | None) -> None:
    event = decision.event
    driver = event.recovery_action  # NVML's reading at the event; `action` is the one followed
    if decision.verdict.kills:
        level = "error"
    elif decision.on_target and event.kind is not EventKind.SINGLE_BIT_ECC:
        level = "warning"
    else:
        level = "info"
    getattr(log, level)(
        "gpu_event",
        gpu=event.index,
        uuid=event.uuid,
        kind=event.kind.value,
        xid=decision.xid,
        meaning=decision.meaning,
        action=decision.action_name,
        driver_action=None if driver is None else driver.name.lower(),
        decision=decision.verdict.value,
        target=decision.on_target,
        xid_count=count,
    )


def watch_plugins(
    sensor: GpuSensor | None, store: StateStore, open_incident: OpenIncident
) -> Plugins:
    """The event watch's plugins where the sensor reads driver events (the NVML worker)."""
    if not isinstance(sensor, GuardedGpuSensor):
        return Plugins()
    return GpuEventGuard(store, sensor.read_events, open_incident).plugins


def merged(*plugins: Plugins) -> Plugins:
    """One Plugins of several (the memory guard's and the event guard's), in order."""

    def every(name: str) -> Sequence[Any]:
        return tuple(item for p in plugins for item in getattr(p, name))

    return Plugins(**{f.name: every(f.name) for f in dataclasses.fields(Plugins)})
