"""The GPU health gate in `run`: read before the first launch (as part of the pre-flight gate)
and again before every relaunch; each pass is one `gpu_health` event with every target GPU's
verdict and readings (status and metrics fold it). An enforce failure refuses the launch
(exit 1, as any failed pre-flight check) unless --force.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from supervisor.config import RunSettings
from supervisor.core.checks import Status
from supervisor.core.ports import GpuSensor
from supervisor.errors import PreflightFailed
from supervisor.preflight.health import HealthGate, read_health_gate

log = structlog.get_logger("supervisor.run")


def read_gate(
    settings: RunSettings, targets: Sequence[int], sensor: GpuSensor | None
) -> HealthGate:
    """One pass of the gate over the target GPUs, logged as `gpu_health` when it read any."""
    gate = read_health_gate(settings.config.gpu, targets, sensor)
    if gate.checks:
        healthy = all(c.status is Status.OK for c in gate.checks)
        (log.info if healthy else log.warning)("gpu_health", **gate.event())
    return gate


def check_before_relaunch(
    settings: RunSettings, targets: Sequence[int], sensor: GpuSensor | None
) -> None:
    """The gate again before a relaunch whose argv the pre-flight already passed.

    Raises:
        PreflightFailed: a target GPU fails the gate (`[gpu] health = "enforce"`), no --force.
    """
    gate = read_gate(settings, targets, sensor)
    failed = gate.failed
    if not failed:
        return
    if settings.run.force:
        log.warning("preflight_failed_forced", failed_checks=[c.detail for c in failed])
        return
    names = ", ".join(c.name for c in failed)
    details = "\n".join(f"  {c.name}: {c.detail}" for c in failed)
    refusal = PreflightFailed(
        f"the GPU health gate refuses this relaunch: {names} failed (--force to launch "
        f"anyway)\n{details}"
    )
    raise refusal
