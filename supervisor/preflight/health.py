"""The pre-launch GPU health gate as pre-flight checks: one `gpu_health_<index>` per target GPU,
ok / warn / fail with the GPU's UUID and the reason (core.gpu_health judges; docs/gpu-health.md).

`[gpu] health`: enforce (a sick GPU fails the check: no launch), warn (it only warns), off (no
health read at all). A GPU that only a reset can fix names the configured reset command.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from supervisor.config import GpuConfig
from supervisor.core.checks import Check, Status
from supervisor.core.gpu_health import (
    GpuVerdict,
    HealthSnapshot,
    Verdict,
    gate_status,
    judge_gpus,
    nvlink_peer_sets,
)
from supervisor.core.gpu_repair import reset_words, resets_peer_sets
from supervisor.core.redact import redact_command

if TYPE_CHECKING:  # a type only: core.ports brings the run loop's events and classifier
    from supervisor.core.ports import GpuSensor

NOT_READ = (
    "not checked: NVML gave no health reading (driver hung or gone); the GPUs' health is unknown"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthGate:
    """One pass of the gate: each target GPU's verdict and the checks they make."""

    mode: str
    verdicts: tuple[GpuVerdict, ...] = ()
    checks: tuple[Check, ...] = ()

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status is Status.FAIL)

    def event(self) -> dict[str, Any]:
        """The `gpu_health` event's fields: the mode and each GPU's verdict and readings."""
        return {
            "mode": self.mode,
            "gpus": [v.to_json() for v in self.verdicts],
            "failed": [c.name for c in self.failed],
        }


def reset_offer(gpu: GpuConfig, verdict: GpuVerdict, snapshot: HealthSnapshot) -> str:
    """How to clear a GPU that only needs a reset: the configured command, filled in for it
    (its whole NVLink peer set with `{indices}`), or what to run by hand."""
    if not gpu.reset_command:
        return (
            f"reset it (as root, no process on it: nvidia-smi --gpu-reset -i {verdict.index}; "
            "or set gpu reset_command) or reboot the node"
        )
    peers: Sequence[int] = ()
    if resets_peer_sets(gpu.reset_command):
        peers = nvlink_peer_sets([verdict.index], snapshot.nvlink)[0]
    words = reset_words(gpu.reset_command, verdict.index, verdict.uuid, peers)
    return f"reset it: {redact_command(words)} (gpu reset_command), or reboot the node"


def health_checks(
    gpu: GpuConfig, snapshot: HealthSnapshot | None, targets: Sequence[int]
) -> HealthGate:
    """The gate over one health read of the GPUs (None: NVML gave none)."""
    if gpu.health == "off":
        return HealthGate(mode=gpu.health)
    if snapshot is None:
        return HealthGate(mode=gpu.health, checks=(Check("gpu_health", Status.WARN, NOT_READ),))
    verdicts = judge_gpus(snapshot, targets, max_volatile_dbe=gpu.max_volatile_dbe)
    checks = []
    for v in verdicts:
        offer = reset_offer(gpu, v, snapshot) if v.verdict is Verdict.FAIL else ""
        status = Status(gate_status(v, gpu.health))
        checks.append(Check(f"gpu_health_{v.index}", status, v.describe(offer)))
    return HealthGate(mode=gpu.health, verdicts=verdicts, checks=tuple(checks))


def read_health_gate(
    gpu: GpuConfig, targets: Sequence[int], sensor: GpuSensor | None
) -> HealthGate:
    """Read the GPUs' health (unless `[gpu] health = "off"` or no GPU is watched) and judge
    the target GPUs."""
    if gpu.health == "off" or sensor is None:
        return HealthGate(mode=gpu.health)
    return health_checks(gpu, sensor.read_health(), targets)
