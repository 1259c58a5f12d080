"""A reset that can work (pure): what the reset command needs before it runs, which GPUs go
together, and what the GPUs' health says once they are free again.

NVLink peer sets: where GPUs cannot be reset one by one (nvidia-smi: NVLink-connected GPUs
before Ampere, Ampere NVSwitch boxes without the fabric manager), the command must name every
GPU of the set at once; a reset command with `{indices}` says so, and gets the whole set
(core.gpu_health.nvlink_peer_sets over NVML's NVLink peer-to-peer pairs). Without it, one
command per GPU.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from supervisor.core.gpu_health import GpuVerdict, HealthSnapshot, Verdict, nvlink_peer_sets
from supervisor.core.gpu_release import GpuCheck, GpuCondition, ReleaseAction, ReleaseDecision


def resets_peer_sets(template: str) -> bool:
    """The reset command takes `{indices}`: it resets whole NVLink peer sets in one call."""
    return "{indices}" in template


def reset_words(template: str, index: int, uuid: str, indices: Sequence[int] = ()) -> list[str]:
    """The reset command for GPU `index` (or the set `indices`): each word of the template
    formatted on its own, as it runs without a shell."""
    shown = ",".join(str(i) for i in (indices or (index,)))
    return [word.format(index=index, uuid=uuid, indices=shown) for word in shlex.split(template)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResetPlan:
    """The reset commands to run, each a GPU or a whole NVLink peer set; or why none may run."""

    sets: tuple[tuple[int, ...], ...] = ()
    refusal: str = ""  # not empty: no reset runs, the GPUs stay unusable (exit 6)


def plan_reset(
    indices: Iterable[int],
    *,
    health: HealthSnapshot | None,
    live_pids: Mapping[int, Sequence[int]],
    peer_sets: bool,
) -> ResetPlan:
    """Group the GPUs to reset (per GPU, or in NVLink peer sets when the command takes
    `{indices}`) and check what a reset needs: no live process on any GPU of a set (nvidia-smi
    refuses, and a reset would kill someone's work), and none lost (a reset cannot bring back a
    GPU fallen off the bus, Xid 79). `live_pids`: the live processes NVML lists per GPU."""
    wanted = sorted(set(indices))
    nvlink = health.nvlink if health is not None and peer_sets else None
    sets = nvlink_peer_sets(wanted, nvlink) if peer_sets else tuple((i,) for i in wanted)
    for group in sets:
        for index in group:
            reading = health.get(index) if health is not None else None
            if reading is not None and reading.lost:
                return ResetPlan(
                    refusal=f"GPU {index} is lost (fallen off the bus, Xid 79): a reset cannot "
                    "bring it back, reboot needed"
                )
            pids = live_pids.get(index, ())
            if pids:
                peer = "" if index in wanted else " (an NVLink peer, reset with them)"
                return ResetPlan(
                    refusal=f"GPU {index}{peer} has running processes "
                    f"{', '.join(map(str, pids))}: a reset needs every process off the GPU"
                )
    return ResetPlan(sets=sets)


def decide_after_release(
    verdicts: Sequence[GpuVerdict],
    *,
    wanted: Iterable[int],
    reset_failed: Mapping[int, str],
    repair: bool,
    enforce: bool,
    reset_available: bool,
    reset_at_s: Mapping[int, float],
    elapsed_s: float,
    reset_settle_s: float,
) -> ReleaseDecision:
    """The GPUs are free; now their health. With `enforce` ([gpu] health), a GPU reset in this
    wait must pass the gate once it settled, and a GPU the gate fails for want of a reset is
    reset when `repair` (after a launch of ours); `wanted` GPUs are reset whatever their health
    says (the driver asked). Other failures are left to the pre-launch gate (exit 1)."""
    if reset_failed:
        index = min(reset_failed)
        reason = f"GPU {index} reset failed: {reset_failed[index]}"
        return ReleaseDecision(action=ReleaseAction.GIVE_UP, reason=reason)
    for v in verdicts:
        if not enforce or v.index not in reset_at_s or v.verdict is not Verdict.FAIL:
            continue
        if elapsed_s - reset_at_s[v.index] < reset_settle_s:
            return ReleaseDecision(
                action=ReleaseAction.WAIT, reason=f"checking GPU {v.index} again after reset"
            )
        return ReleaseDecision(
            action=ReleaseAction.GIVE_UP,
            reason=f"still failing its health check after a reset: {v.describe()}",
        )
    asked = set(wanted)
    sick = {v.index for v in verdicts if repair and enforce and v.needs_reset}
    todo = tuple(sorted(i for i in asked | sick if i not in reset_at_s))
    if todo and not reset_available and asked - set(reset_at_s):
        return ReleaseDecision(
            action=ReleaseAction.GIVE_UP,
            reason=f"GPU(s) {', '.join(map(str, sorted(asked)))} need a reset and no gpu "
            "reset_command is configured",
        )
    if todo and reset_available:
        uuids = {v.index: v.uuid for v in verdicts}
        return ReleaseDecision(
            action=ReleaseAction.RESET,
            reason=f"resetting GPU(s) {', '.join(map(str, todo))}: "
            + " | ".join(v.describe() for v in verdicts if v.index in todo),
            reset_gpus=tuple(
                GpuCheck(index=i, uuid=uuids.get(i) or None, condition=GpuCondition.CLEAN)
                for i in todo
            ),
        )
    return ReleaseDecision(action=ReleaseAction.DONE, reason="all target GPUs are free")


def reset_status(
    sets: Sequence[Sequence[int]], ended: Mapping[tuple[int, ...], bool], elapsed_s: float
) -> str:
    """systemd's STATUS= while resets run in parallel: which GPUs, how many ended, how long."""
    gpus = ", ".join(str(i) for group in sets for i in group)
    failed = sorted(i for group, ok in ended.items() if not ok for i in group)
    parts = [f"resetting GPU(s) {gpus}: {len(ended)} of {len(sets)} done"]
    if failed:
        parts.append(f"failed: {', '.join(map(str, failed))}")
    parts.append(f"{elapsed_s:.0f} s")
    return "; ".join(parts)
