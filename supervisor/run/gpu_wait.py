"""After the server tree is gone: wait until the target GPUs are really free, kill our leftover
holders, reset a GPU whose memory stays held or that needs a reset, or give up (exit 6) rather
than relaunch onto it.

The decisions are core.gpu_release's and core.gpu_repair's, ownership core.ownership's; this
module reads, sleeps, signals and logs, run/gpu_repair.py resets and reads the GPUs' health.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from supervisor.config import GpuConfig
from supervisor.core.classify import FailureKind
from supervisor.core.gpu_health import judge_gpus
from supervisor.core.gpu_release import GpuCheck, ReleaseAction, ReleaseDecision, decide_release
from supervisor.core.ports import Clock, GpuResetter, GpuSensor, Processes
from supervisor.core.readings import GpuState
from supervisor.core.units import GiB
from supervisor.errors import GpuUnrecoverable
from supervisor.run.gpu_holders import Holders, holders_of, judge_holders, kill_holders
from supervisor.run.gpu_repair import (
    HealthRules,
    after_release,
    live_pids,
    lost_target,
    run_resets,
    verdicts_json,
)
from supervisor.run.state import StateStore

log = structlog.get_logger("supervisor.gpu_wait")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseLimits:
    """How long and how closely the release wait looks ([gpu] settings, defaults in config)."""

    timeout_s: float = 120.0  # 243 GB pinned takes ~26 s to unpin (sgl-project/sglang #32829)
    d_state_grace_s: float = 120.0  # more for holders stuck in D state
    tolerance_bytes: int = 1 * GiB  # used memory this close to the baseline counts as free
    reset_settle_s: float = 5.0  # after a reset, the GPU must be clean this soon
    # Ollama polls free VRAM every 250 ms after an unload (docs/peers.md): prompt enough to
    # relaunch, cheap enough for an NVML worker.
    poll_interval_s: float = 0.25
    reset_timeout_s: float = 120.0  # one reset command ([gpu] reset_timeout)

    @classmethod
    def from_config(cls, gpu: GpuConfig) -> ReleaseLimits:
        return cls(
            timeout_s=gpu.release_timeout_s,
            d_state_grace_s=gpu.d_state_grace_s,
            tolerance_bytes=gpu.release_tolerance_bytes,
            reset_timeout_s=gpu.reset_timeout_s,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseResult:
    """How the wait for the GPUs ended. `ok` False means: do not relaunch (exit 6)."""

    ok: bool
    reason: str
    elapsed_s: float
    checks: tuple[GpuCheck, ...] = ()
    killed_pids: tuple[int, ...] = ()
    reset_gpus: tuple[int, ...] = ()
    d_state_pids: tuple[int, ...] = ()  # holders we waited for instead of re-killing
    health: tuple[dict[str, object], ...] = ()  # the last health verdicts and readings read

    def as_dict(self) -> dict[str, object]:
        """Plain data for the incident file and log events."""
        return {
            "ok": self.ok,
            "reason": self.reason,
            "elapsed_s": round(self.elapsed_s, 3),
            "killed_pids": list(self.killed_pids),
            "reset_gpus": list(self.reset_gpus),
            "d_state_pids": list(self.d_state_pids),
            "gpus": [c.to_json() for c in self.checks],
            "health": list(self.health),
        }


def measure_baselines(sensor: GpuSensor, gpu_indices: Iterable[int]) -> dict[str, int]:
    """Used bytes per target GPU UUID before the first launch (empty when NVML gives no answer).

    A GPU that lists processes at that moment (leftovers of an earlier run, say) gets no
    baseline: its memory is not idle, and baseline 0 + tolerance is the safe judgement.
    """
    gpus, wanted = sensor.read_gpus(), set(gpu_indices)
    return {g.uuid: g.used_bytes for g in gpus or () if g.index in wanted and not g.processes}


@dataclasses.dataclass
class _Wait:
    """The mutable bookkeeping of one release wait (what was killed, reset, seen in D state)."""

    targets: tuple[int, ...]
    rules: HealthRules
    limits: ReleaseLimits
    clock: Clock
    started: float  # on `clock`
    status: Callable[[str], object]  # systemd's STATUS= (the resets' progress)
    wanted: tuple[int, ...] = ()  # reset once free, whatever their health reads
    health: tuple[dict[str, object], ...] = ()
    killed: set[int] = dataclasses.field(default_factory=set)
    d_seen: set[int] = dataclasses.field(default_factory=set)
    reset_at: dict[int, float] = dataclasses.field(default_factory=dict)
    reset_failed: dict[int, str] = dataclasses.field(default_factory=dict)
    last_reason: str = ""

    def result(
        self, checks: tuple[GpuCheck, ...], ok: bool, reason: str, elapsed_s: float
    ) -> ReleaseResult:
        return ReleaseResult(
            ok=ok,
            reason=reason,
            elapsed_s=elapsed_s,
            checks=checks,
            killed_pids=tuple(sorted(self.killed)),
            reset_gpus=tuple(sorted(self.reset_at)),
            d_state_pids=tuple(sorted(self.d_seen)),
            health=self.health,
        )


def _reset(
    decision: ReleaseDecision,
    sensor: GpuSensor,
    resetter: GpuResetter,
    wait: _Wait,
    gpus: Sequence[GpuState] | None,
    holders: Holders,
) -> str:
    """Run the resets the decision names (as core.gpu_repair plans them); why not, or ""."""
    done = run_resets(
        decision.reset_gpus,
        sensor=sensor,
        resetter=resetter,
        live=live_pids(gpus, holders.state),
        peer_sets=wait.rules.peer_sets,
        reset_at=wait.reset_at,
        reset_failed=wait.reset_failed,
        clock=wait.clock,
        elapsed=lambda: wait.clock.monotonic() - wait.started,
        reset_timeout_s=wait.limits.reset_timeout_s,
        status=wait.status,
    )
    if done.health is not None:
        rules = wait.rules
        verdicts = judge_gpus(done.health, wait.targets, max_volatile_dbe=rules.max_volatile_dbe)
        wait.health = verdicts_json(verdicts)
    return done.refusal


def _decide(
    sensor: GpuSensor,
    gpus: Sequence[GpuState] | None,
    checks: tuple[GpuCheck, ...],
    wait: _Wait,
    elapsed_s: float,
    reset_available: bool,
) -> ReleaseDecision:
    """Memory and processes first (core.gpu_release); once free, the GPUs' health."""
    lim = wait.limits
    lost = lost_target(sensor, checks, gpus)
    if lost is not None:
        return ReleaseDecision(action=ReleaseAction.GIVE_UP, reason=lost)
    decision = decide_release(
        checks,
        elapsed_s=elapsed_s,
        timeout_s=lim.timeout_s,
        d_state_grace_s=lim.d_state_grace_s,
        killed_pids=frozenset(wait.killed),
        reset_available=reset_available,
        reset_at_s=wait.reset_at,
        reset_failed=wait.reset_failed,
        reset_settle_s=lim.reset_settle_s,
    )
    if decision.action is not ReleaseAction.DONE:
        return decision
    decision, verdicts = after_release(
        sensor,
        wait.targets,
        wait.rules,
        wanted=wait.wanted,
        reset_at=wait.reset_at,
        reset_failed=wait.reset_failed,
        reset_available=reset_available,
        elapsed_s=elapsed_s,
        settle_s=lim.reset_settle_s,
    )
    if verdicts:
        wait.health = verdicts_json(verdicts)
    return decision


def _given_up(
    wait: _Wait, checks: tuple[GpuCheck, ...], reason: str, elapsed_s: float
) -> ReleaseResult:
    gpus = [c.to_json() for c in checks]  # each GPU's bytes as integers, and in words
    log.error("gpu_release_failed", elapsed_s=round(elapsed_s, 3), reason=reason, gpus=gpus)
    return wait.result(checks, False, reason, elapsed_s)


def wait_for_gpu_release(
    sensor: GpuSensor,
    gpu_indices: Sequence[int],
    old_pids: Iterable[int],
    *,
    clock: Clock,
    holders: Holders,
    baselines: Mapping[str, int] | None = None,
    resetter: GpuResetter | None = None,
    limits: ReleaseLimits | None = None,
    health: HealthRules | None = None,
    reset: Iterable[int] = (),
    status: Callable[[str], object] = lambda _text: None,
) -> ReleaseResult:
    """Block until no target GPU lists a process of the old run and used memory is back near the
    baseline, killing live holders of ours, waiting for D-state ones, resetting memory held with
    no process; give up after the limits' timeout (+ the D-state grace for D-state holders).
    Then, by `health` (default: not read), the GPUs' health: a GPU reset here must pass the
    gate, one that needs a reset gets it; and the `reset` GPUs are reset whatever it says.
    Resets run in parallel while `clock` (an EventClock) ticks, their progress told to `status`.

    `holders` judges the listed PIDs that are not in `old_pids`, reads their state and kills.
    Returns a ReleaseResult; `ok` False: the GPUs must not be used (raise_if_unrecoverable).
    """
    lim = limits or ReleaseLimits()
    started = clock.monotonic()
    targets = tuple(gpu_indices)
    known_ours = frozenset(old_pids)
    wait = _Wait(targets, health or HealthRules(), lim, clock, started, status, tuple(reset))
    if not targets:
        return ReleaseResult(ok=True, reason="no target GPUs watched", elapsed_s=0.0)
    while True:
        elapsed = clock.monotonic() - started
        gpus = sensor.read_gpus()
        if gpus is not None and len(gpus) == 0:
            # No GPU visible at all (a box without GPUs): nothing can be held.
            return ReleaseResult(ok=True, reason="no GPUs visible", elapsed_s=elapsed)
        checks = judge_holders(
            gpus, targets, known_ours, holders, baselines or {}, lim.tolerance_bytes
        )
        wait.d_seen.update(pid for c in checks for pid in c.d_state)
        decision = _decide(sensor, gpus, checks, wait, elapsed, resetter is not None)
        if decision.action is ReleaseAction.DONE:
            log.info("gpu_release_done", elapsed_s=round(elapsed, 3), gpus=list(targets))
            return wait.result(checks, True, decision.reason, elapsed)
        if decision.action is ReleaseAction.GIVE_UP:
            return _given_up(wait, checks, decision.reason, elapsed)
        if decision.action is ReleaseAction.KILL:
            kill_holders(decision.kill_pids, holders.kill, wait.killed)
        elif decision.action is ReleaseAction.RESET and resetter is not None:
            refusal = _reset(decision, sensor, resetter, wait, gpus, holders)
            if refusal:
                return _given_up(wait, checks, refusal, elapsed)
        else:
            if decision.reason != wait.last_reason:
                log.info("gpu_release_waiting", elapsed_s=round(elapsed, 3), reason=decision.reason)
                wait.last_reason = decision.reason
            clock.sleep(lim.poll_interval_s)


def raise_if_unrecoverable(
    result: ReleaseResult, notify_status: Callable[[str], object] | None = None
) -> None:
    """Turn a failed release into GpuUnrecoverable (exit 6), telling systemd's STATUS= first.

    Raises:
        GpuUnrecoverable: a target GPU is still held after kill, wait and reset; relaunching onto
            it would fail or leak more (usually a D-state process stuck in the driver, a failed
            reset, or NVML hung: the node needs an operator, often a reboot).
    """
    if result.ok:
        return
    if notify_status is not None:
        notify_status(f"gpu unrecoverable: {result.reason}"[:200])
    raise GpuUnrecoverable(f"GPUs not released, not relaunching: {result.reason}")


class GpuRelease:
    """Waits until the GPUs of a dead run are free; exit 6 (GpuUnrecoverable) when one stays
    dirty. A no-op without a GPU sensor (backend none)."""

    def __init__(
        self,
        gpu: GpuConfig,
        gpu_indices: Sequence[int],
        *,
        instance: str,
        sensor: GpuSensor | None,
        processes: Processes,
        store: StateStore,
        resetter: GpuResetter | None = None,
        hooks: Sequence[Callable[[ReleaseResult], None]] = (),
        notify_status: Callable[[str], object] | None = None,
    ) -> None:
        self.gpu = gpu
        self.indices = tuple(gpu_indices)
        self.instance = instance
        self.sensor = sensor
        self.processes = processes
        self.store = store
        self.resetter = resetter
        self.hooks = hooks
        self.notify_status = notify_status
        self.baselines: dict[str, int] = {}
        # Before the first launch a GPU that needs a reset is the gate's to refuse (the
        # operator decides); after a launch of ours, the wait resets it (measure_baselines).
        self.health = HealthRules.from_config(gpu, repair=False)

    def measure_baselines(self, clock: Clock, *, force: bool = False) -> None:
        """Used memory per target GPU before the first launch: "released" means back near it.

        NVML must answer first: a launch onto GPUs whose state nobody can read may land on a
        held or broken GPU, and SGLang's own CUDA init would hang where NVML hangs. It is
        asked again until gpu.release_timeout; `force` launches with the state unknown then.

        Raises:
            GpuUnrecoverable: NVML never answered (without `force`).
            StopRequested: from `clock` (an EventClock), when a stop signal arrives.
        """
        if self.sensor is None:
            return
        self.health = dataclasses.replace(self.health, repair=True)  # every wait from now on
        if self.sensor.read_gpus() is None and not self._nvml_answers(clock, force):
            return
        self.baselines = measure_baselines(self.sensor, self.indices)

    def _nvml_answers(self, clock: Clock, force: bool) -> bool:
        assert self.sensor is not None
        limit_s = self.gpu.release_timeout_s
        log.error("nvml_unanswered", waiting_s=limit_s, detail="not launching onto unread GPUs")
        if self.notify_status is not None:
            self.notify_status(f"waiting for NVML to answer (up to {limit_s:g} s)")
        started = clock.monotonic()
        while clock.monotonic() - started < limit_s:
            clock.sleep(1.0)
            if self.sensor.read_gpus() is not None:
                log.info("nvml_answered", waited_s=round(clock.monotonic() - started, 3))
                return True
        reason = (
            f"NVML gave no answer for {limit_s:g} s before the first launch: the driver or a "
            "GPU is hung (nvidia-smi would hang too); reset the GPU or reboot the node"
        )
        if force:
            log.warning("launching_gpus_unknown", reason=reason, forced=True)
            return False
        raise_if_unrecoverable(
            ReleaseResult(ok=False, reason=reason, elapsed_s=clock.monotonic() - started),
            self.notify_status,
        )
        return False

    def wait(self, old_pids: Sequence[int], clock: Clock, *, reset: Iterable[int] = ()) -> None:
        """Block until no target GPU lists `old_pids` and memory is back near the baseline;
        then, with `[gpu] health = "enforce"`, until their health passes: a GPU that needs a
        reset gets one (after the first launch), a GPU reset here must pass the gate.

        `old_pids` may be empty (a tree killed whole from outside, by the OOM killer or an
        operator, is reaped before the supervisor reads it): the GPUs are checked all the same,
        since a tree that died unseen can leave them as dirty as one we killed. `reset`: target
        GPUs to reset once free whatever their health reads (the driver asked for it).

        Raises:
            GpuUnrecoverable: a GPU stays held after kill, wait and reset; one to reset is lost
                or shares its NVLink peer set with a running process; one is still sick after
                its reset.
            StopRequested: from `clock` (an EventClock), when a stop signal arrives.
        """
        if self.sensor is None:
            return
        result = wait_for_gpu_release(
            self.sensor,
            self.indices,
            old_pids,
            clock=clock,
            holders=holders_of(self.processes, self.instance),
            baselines=self.baselines,
            resetter=self.resetter,
            limits=ReleaseLimits.from_config(self.gpu),
            health=self.health,
            reset=reset,
            status=self.notify_status or (lambda _text: None),
        )
        for hook in self.hooks:
            hook(result)
        if not result.ok:
            self.store.update(
                lambda s: dataclasses.replace(
                    s, last_failure=FailureKind.GPU_DIRTY.value, last_failure_hint=result.reason
                )
            )
        raise_if_unrecoverable(result, self.notify_status)
