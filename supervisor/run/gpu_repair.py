"""The GPU release wait's resets and health checks (supervisor/run/gpu_wait.py's loop calls them).

A reset runs only when core.gpu_repair says it can work (no live process on any GPU of the set,
none lost), on a whole NVLink peer set when the command takes `{indices}`. Once the GPUs are
free their health is read: a GPU reset in this wait must pass the gate, one that needs a reset
gets it (after a launch of ours), the rest is the pre-launch gate's to refuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from supervisor.config import GpuConfig
from supervisor.core.gpu_health import GpuVerdict, HealthSnapshot, judge_gpus
from supervisor.core.gpu_release import GpuCheck, GpuCondition, ReleaseAction, ReleaseDecision
from supervisor.core.gpu_repair import decide_after_release, plan_reset, resets_peer_sets
from supervisor.core.ports import GpuResetter, GpuSensor
from supervisor.core.readings import GpuState

log = structlog.get_logger("supervisor.gpu_wait")


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
    elapsed: Callable[[], float],
) -> Resets:
    """Reset the GPUs of `checks` as core.gpu_repair plans it; each GPU of a set is marked
    reset (`reset_at`) and, on failure, failed (`reset_failed`)."""
    health = sensor.read_health()  # before NVML is let go of: lost GPUs, NVLink peers
    wanted = {c.index: c.uuid or "" for c in checks}
    plan = plan_reset(wanted, health=health, live_pids=live, peer_sets=peer_sets)
    if plan.refusal:
        log.error("gpu_reset_refused", gpus=sorted(wanted), reason=plan.refusal)
        return Resets(refusal=plan.refusal, health=health)
    # A reset needs every NVML client gone, our own handle included (docs/peers.md, GPU reset).
    sensor.close()
    for group in plan.sets:
        index = next(i for i in group if i in wanted)
        uuid = wanted[index] or _uuid(health, index)
        log.warning("gpu_reset_started", gpu=index, uuid=uuid, gpus=list(group))
        outcome = resetter.reset(index, uuid, group if peer_sets else ())
        done_s = elapsed()
        for member in group:
            reset_at[member] = done_s
        if outcome.ok:
            log.info("gpu_reset_done", gpu=index, gpus=list(group), detail=outcome.detail)
            continue
        for member in group:
            reset_failed[member] = outcome.detail or "reset command failed"
        log.error("gpu_reset_failed", gpu=index, gpus=list(group), detail=outcome.detail)
    return Resets(health=health)


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
