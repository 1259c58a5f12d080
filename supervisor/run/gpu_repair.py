"""The GPU release wait's resets and health checks (supervisor/run/gpu_wait.py's loop calls them).

A reset runs only when core.gpu_repair says it can work (no live process on any GPU of the set,
none lost), on a whole NVLink peer set when the command takes `{indices}`. Once the GPUs are
free their health is read: a GPU reset in this wait must pass the gate, one that needs a reset
gets it (after a launch of ours), the rest is the pre-launch gate's to refuse.

The resets of one round run in parallel, one worker thread per GPU or peer set, off the run
loop: a reset takes up to `reset_timeout` (2 min) and eight of them one after another would
outlast WatchdogSec, so systemd would abort the supervisor mid-reset instead of the intended
relaunch or exit 6. Meanwhile the loop keeps ticking (run/events.py `wait_for`): WATCHDOG=1,
EXTEND_TIMEOUT_USEC while the unit starts, signals; each reset's end is logged and told to
systemd (STATUS=) as it comes. A stop signal kills the resets still running (the resetter's
`close`) and ends the run; the next start finds the GPUs as they are and decides again.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from supervisor.config import GpuConfig
from supervisor.core.gpu_health import GpuVerdict, HealthSnapshot, judge_gpus
from supervisor.core.gpu_release import (
    GpuCheck,
    GpuCondition,
    ReleaseAction,
    ReleaseDecision,
    ResetOutcome,
)
from supervisor.core.gpu_repair import (
    decide_after_release,
    plan_reset,
    reset_status,
    resets_peer_sets,
)
from supervisor.core.ports import Clock, GpuResetter, GpuSensor
from supervisor.core.readings import GpuState
from supervisor.run.events import EventClock, StopRequested

log = structlog.get_logger("supervisor.gpu_wait")

# After its timeout a reset command is killed with all it started, in seconds (adapters/command.py
# WAIT_SLACK_S): past this much more, a reset that has not ended is a bug, and failed.
RESET_SLACK_S = 30.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthRules:
    """How the release wait treats the GPUs' health ([gpu] health, max_volatile_dbe)."""

    mode: str = "off"  # enforce | warn | off: only enforce resets for health or gives up on it
    max_volatile_dbe: int = 0
    repair: bool = False  # reset a GPU the gate fails for want of a reset (after our launch)
    peer_sets: bool = False  # the reset command takes {indices}: whole NVLink peer sets

    @classmethod
    def from_config(cls, gpu: GpuConfig, *, repair: bool = False) -> HealthRules:
        return cls(
            mode=gpu.health,
            max_volatile_dbe=gpu.max_volatile_dbe,
            repair=repair,
            peer_sets=resets_peer_sets(gpu.reset_command),
        )

    @property
    def enforce(self) -> bool:
        return self.mode == "enforce"


def verdicts_json(verdicts: Sequence[GpuVerdict]) -> tuple[dict[str, object], ...]:
    return tuple(v.to_json() for v in verdicts)


def live_pids(
    gpus: Sequence[GpuState] | None, state: Callable[[int], str | None]
) -> dict[int, tuple[int, ...]]:
    """The processes NVML lists per GPU that are alive (not gone, not a zombie)."""
    alive: dict[int, tuple[int, ...]] = {}
    for gpu in gpus or ():
        pids = tuple(p.pid for p in gpu.processes if state(p.pid) not in (None, "Z", "X", "x"))
        if pids:
            alive[gpu.index] = pids
    return alive


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Resets:
    """What one round of resets did: the refusal (nothing ran) and the health read before."""

    refusal: str = ""
    health: HealthSnapshot | None = None


def run_resets(
    checks: Sequence[GpuCheck],
    *,
    sensor: GpuSensor,
    resetter: GpuResetter,
    live: Mapping[int, Sequence[int]],
    peer_sets: bool,
    reset_at: dict[int, float],
    reset_failed: dict[int, str],
    clock: Clock,
    elapsed: Callable[[], float],
    reset_timeout_s: float,
    status: Callable[[str], object] = lambda _text: None,
) -> Resets:
    """Reset the GPUs of `checks` as core.gpu_repair plans it, all sets at once; each GPU of a
    set is marked reset (`reset_at`) and, on failure, failed (`reset_failed`). A reset still
    running RESET_SLACK_S past `reset_timeout_s` (the command's own timeout: it is killed then)
    is failed.

    Raises:
        StopRequested: from `clock` (an EventClock): the resets still running were killed.
    """
    health = sensor.read_health()  # before NVML is let go of: lost GPUs, NVLink peers
    wanted = {c.index: c.uuid or "" for c in checks}
    plan = plan_reset(wanted, health=health, live_pids=live, peer_sets=peer_sets)
    if plan.refusal:
        log.error("gpu_reset_refused", gpus=sorted(wanted), reason=plan.refusal)
        return Resets(refusal=plan.refusal, health=health)
    # A reset needs every NVML client gone, our own handle included (docs/peers.md, GPU reset).
    sensor.close()
    jobs = []
    for group in plan.sets:
        index = next(i for i in group if i in wanted)
        jobs.append(_Job(index=index, uuid=wanted[index] or _uuid(health, index), gpus=group))
    bound_s = reset_timeout_s + RESET_SLACK_S
    ended = ParallelResets(resetter, peer_sets, clock, elapsed, status).run(jobs, bound_s)
    for job in jobs:
        outcome, done_s = ended.get(job.gpus, (_unfinished(bound_s), elapsed()))
        if job.gpus not in ended:  # a bug: its worker is left behind, the run ends (exit 6)
            log.error("gpu_reset_failed", gpu=job.index, gpus=list(job.gpus), detail=outcome.detail)
        for member in job.gpus:
            reset_at[member] = done_s
            if not outcome.ok:
                reset_failed[member] = outcome.detail or "reset command failed"
    return Resets(health=health)


def _unfinished(bound_s: float) -> ResetOutcome:
    return ResetOutcome(ok=False, detail=f"the reset did not end within {bound_s:g} s")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    index: int  # the GPU that needed it: {index}, {uuid}
    uuid: str
    gpus: tuple[int, ...]  # its whole peer set ({indices}), or the GPU alone


class ParallelResets:
    """One round of resets: a worker thread per job, the loop ticking until each has ended."""

    def __init__(
        self,
        resetter: GpuResetter,
        peer_sets: bool,
        clock: Clock,
        elapsed: Callable[[], float],
        status: Callable[[str], object],
    ) -> None:
        self.resetter = resetter
        self.peer_sets = peer_sets
        self.clock = clock
        self.elapsed = elapsed
        self.status = status
        self._lock = threading.Lock()
        self._ended: dict[tuple[int, ...], tuple[ResetOutcome, float]] = {}
        self._told: dict[tuple[int, ...], bool] = {}  # ended and logged: ok?
        self._jobs: Sequence[_Job] = ()

    def run(
        self, jobs: Sequence[_Job], bound_s: float
    ) -> dict[tuple[int, ...], tuple[ResetOutcome, float]]:
        """Start every job, wait for them (at most `bound_s`); what ended, and when.

        Raises:
            StopRequested: from an EventClock; the resetter is closed (the resets killed) and
                the workers joined first.
        """
        self._jobs = jobs
        threads = [
            # Daemons: a worker wedged by a bug must not keep the supervisor from exiting.
            threading.Thread(
                target=self._work, args=(job,), name=f"gpu-reset-{job.index}", daemon=True
            )
            for job in jobs
        ]
        for job in jobs:
            log.warning("gpu_reset_started", gpu=job.index, uuid=job.uuid, gpus=list(job.gpus))
        self.status(reset_status([j.gpus for j in jobs], {}, self.elapsed()))
        for thread in threads:
            thread.start()
        try:
            self._wait(threads, bound_s)
        except StopRequested:
            self.resetter.close()  # the commands are killed: the workers end within seconds
            self._join(threads, bound_s)
            raise
        finally:
            self._tell()
        with self._lock:
            return dict(self._ended)

    def _work(self, job: _Job) -> None:
        try:
            outcome = self.resetter.reset(job.index, job.uuid, job.gpus if self.peer_sets else ())
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the loop waiting
            outcome = ResetOutcome(ok=False, detail=f"the reset raised {exc!r}")
        with self._lock:
            self._ended[job.gpus] = (outcome, self.elapsed())
        if isinstance(self.clock, EventClock):
            self.clock.wake()

    def _wait(self, threads: Sequence[threading.Thread], bound_s: float) -> None:
        if isinstance(self.clock, EventClock):  # the loop ticks: watchdog, signals, extensions
            self.clock.wait_for(lambda: self._tell() == len(threads), bound_s)
        else:  # a plain clock (tests, one-shot commands): nothing to feed meanwhile
            self._join(threads, bound_s)

    @staticmethod
    def _join(threads: Sequence[threading.Thread], bound_s: float) -> None:
        for thread in threads:  # each reset is bounded by itself: this bound is for a bug
            thread.join(bound_s)

    def _tell(self) -> int:
        """Log each reset that ended since the last call, and STATUS=; how many have ended."""
        with self._lock:
            fresh = {g: o for g, (o, _) in self._ended.items() if g not in self._told}
        for gpus, outcome in fresh.items():
            self._told[gpus] = outcome.ok
            index = next(j.index for j in self._jobs if j.gpus == gpus)
            if outcome.ok:
                log.info("gpu_reset_done", gpu=index, gpus=list(gpus), detail=outcome.detail)
            else:
                log.error("gpu_reset_failed", gpu=index, gpus=list(gpus), detail=outcome.detail)
        if fresh:
            sets = [j.gpus for j in self._jobs]
            self.status(reset_status(sets, self._told, self.elapsed()))
        return len(self._told)


def _uuid(health: HealthSnapshot | None, index: int) -> str:
    reading = health.get(index) if health is not None else None
    return reading.uuid if reading is not None else ""


def after_release(
    sensor: GpuSensor,
    targets: Sequence[int],
    rules: HealthRules,
    *,
    wanted: Iterable[int],
    reset_at: Mapping[int, float],
    reset_failed: Mapping[int, str],
    reset_available: bool,
    elapsed_s: float,
    settle_s: float,
) -> tuple[ReleaseDecision, tuple[GpuVerdict, ...]]:
    """The GPUs are free of processes and memory: what their health asks for next."""
    asked = tuple(wanted)
    if not rules.enforce and not asked:  # warn / off: the pre-launch gate only reports
        return ReleaseDecision(action=ReleaseAction.DONE, reason="all target GPUs are free"), ()
    snapshot = sensor.read_health()
    verdicts = (
        judge_gpus(snapshot, targets, max_volatile_dbe=rules.max_volatile_dbe)
        if snapshot is not None
        else ()
    )
    decision = decide_after_release(
        verdicts,
        wanted=asked,
        reset_failed={i: reset_failed[i] for i in targets if i in reset_failed},
        repair=rules.repair,
        enforce=rules.enforce,
        reset_available=reset_available,
        reset_at_s=reset_at,
        elapsed_s=elapsed_s,
        reset_settle_s=settle_s,
    )
    return decision, verdicts


def lost_target(
    sensor: GpuSensor, checks: Sequence[GpuCheck], gpus: Sequence[GpuState] | None
) -> str | None:
    """A target GPU NVML answers without (left out of an answered read) that the health read
    calls lost: no wait or reset can help, say so at once rather than after the timeout."""
    if gpus is None or not any(c.condition is GpuCondition.UNKNOWN for c in checks):
        return None
    health = sensor.read_health()
    for check in checks:
        reading = health.get(check.index) if health is not None else None
        if check.condition is GpuCondition.UNKNOWN and reading is not None and reading.lost:
            return (
                f"GPU {check.index} is lost (fallen off the bus, Xid 79): a reset cannot bring "
                "it back, reboot needed"
            )
    return None
