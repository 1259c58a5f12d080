"""After the server tree is gone: wait until the target GPUs are really free, kill our leftover
holders, reset a GPU whose memory stays held, or give up (exit 6) rather than relaunch onto it.

The decisions are core.gpu_release's; this module reads, sleeps, signals, resets and logs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from supervisor.adapters import reclaim
from supervisor.adapters.nvml import NoGpuSensor
from supervisor.adapters.procfs import INSTANCE_ENV, ProcReader
from supervisor.core.gpu_release import (
    GpuCheck,
    ReleaseAction,
    assess_gpus,
    decide_release,
)
from supervisor.core.liveness import is_sglang_title
from supervisor.core.readings import GpuState
from supervisor.core.units import GiB
from supervisor.errors import GpuUnrecoverable
from supervisor.ports import Clock, GpuResetter, GpuSensor

log = structlog.get_logger("supervisor.cleanup")

# Ollama polls free VRAM every 250 ms after an unload (prior-art.md §8); fast enough to relaunch
# promptly, cheap enough for an NVML worker.
DEFAULT_POLL_INTERVAL_S = 0.25
DEFAULT_RELEASE_TIMEOUT_S = 120.0
DEFAULT_TOLERANCE_BYTES = 1 * GiB
DEFAULT_RESET_SETTLE_S = 5.0


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

    def as_dict(self) -> dict[str, object]:
        """Plain data for the incident file and log events."""
        return {
            "ok": self.ok,
            "reason": self.reason,
            "elapsed_s": round(self.elapsed_s, 3),
            "killed_pids": list(self.killed_pids),
            "reset_gpus": list(self.reset_gpus),
            "d_state_pids": list(self.d_state_pids),
            "gpus": [c.describe() for c in self.checks],
        }


def measure_baselines(sensor: GpuSensor, gpu_indices: Iterable[int]) -> dict[str, int]:
    """Used bytes per target GPU UUID before the first launch (empty when NVML gives no answer).

    A GPU that lists processes at that moment (leftovers of an earlier run, say) gets no
    baseline: its memory is not idle, and baseline 0 + tolerance is the safe judgement.
    """
    gpus = sensor.read_gpus()
    wanted = set(gpu_indices)
    return {g.uuid: g.used_bytes for g in gpus or () if g.index in wanted and not g.processes}


def is_ours_by_sight(pid: int) -> bool:
    """A process NVML lists that we own though its PID was not recorded: an SGLang title, or the
    supervisor's environment marker (inherited by every descendant, escapees included). Never
    a process whose launching supervisor is alive and not us: that tree is another instance's."""
    proc = ProcReader()
    if proc.supervised_by_another(pid):
        return False
    return is_sglang_title(proc.title(pid)) or proc.environ_has(pid, INSTANCE_ENV)


def _listed_pids(gpus: Sequence[GpuState] | None, targets: Iterable[int]) -> set[int]:
    wanted = set(targets)
    return {p.pid for g in gpus or () if g.index in wanted for p in g.processes}


def wait_for_gpu_release(
    sensor: GpuSensor,
    gpu_indices: Sequence[int],
    old_pids: Iterable[int],
    *,
    timeout_s: float = DEFAULT_RELEASE_TIMEOUT_S,
    clock: Clock,
    baselines: Mapping[str, int] | None = None,
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
    resetter: GpuResetter | None = None,
    d_state_grace_s: float = DEFAULT_RELEASE_TIMEOUT_S,
    reset_settle_s: float = DEFAULT_RESET_SETTLE_S,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    is_ours: Callable[[int], bool] = is_ours_by_sight,
    process_state: Callable[[int], str | None] = reclaim.process_state,
    kill: Callable[[int], bool] = reclaim.kill_and_reclaim,
) -> ReleaseResult:
    """Block until no target GPU lists a process of the old run and used memory is back near the
    baseline, killing live holders of ours, waiting for D-state ones, resetting memory held with
    no process; give up after `timeout_s` (+ `d_state_grace_s` for D-state holders).

    Args:
        sensor: GPU readings; use an isolated one (adapters/gpu_guard.py) so a hung NVML call
            cannot block this loop.
        gpu_indices: the run's GPUs (LaunchPlan.local_gpu_ids()). Empty: nothing to wait for.
        old_pids: PIDs of the old run's tree (recorded in the state file, or read before kill).
        baselines: used bytes per GPU UUID measured before the first launch (measure_baselines);
            missing GPUs count as baseline 0.
        is_ours: extra test for a listed PID not in `old_pids` (default: is_ours_by_sight).
        process_state: /proc state letter of a PID, None when gone.
        kill: SIGKILL one PID (returns False if it was already gone).

    Returns a ReleaseResult; `ok` False: the GPUs must not be used (raise_if_unrecoverable).
    """
    started = clock.monotonic()
    targets = tuple(gpu_indices)
    known_ours = frozenset(old_pids)
    base = dict(baselines or {})
    killed: set[int] = set()
    d_seen: set[int] = set()
    reset_at: dict[int, float] = {}
    reset_failed: dict[int, str] = {}
    last_reason = ""
    if (
        not targets
        or getattr(sensor, "is_watching", True) is False
        or isinstance(sensor, NoGpuSensor)
    ):
        return ReleaseResult(ok=True, reason="no target GPUs watched", elapsed_s=0.0)
    while True:
        elapsed = clock.monotonic() - started
        gpus = sensor.read_gpus()
        if gpus is not None and len(gpus) == 0:
            # No GPU visible at all (backend "none", or a box without GPUs): nothing can be held.
            return ReleaseResult(ok=True, reason="no GPUs visible", elapsed_s=elapsed)
        listed = _listed_pids(gpus, targets)
        states = {pid: process_state(pid) for pid in listed}
        ours = known_ours | {pid for pid in listed if pid not in known_ours and is_ours(pid)}
        checks = assess_gpus(
            gpus, targets, ours=ours, states=states, baselines=base, tolerance_bytes=tolerance_bytes
        )
        for c in checks:
            d_seen.update(c.d_state)
        decision = decide_release(
            checks,
            elapsed_s=elapsed,
            timeout_s=timeout_s,
            d_state_grace_s=d_state_grace_s,
            killed_pids=frozenset(killed),
            reset_available=resetter is not None,
            reset_at_s=reset_at,
            reset_failed=reset_failed,
            reset_settle_s=reset_settle_s,
        )
        result = _partial_result(checks=checks, killed=killed, reset_at=reset_at, d_seen=d_seen)
        if decision.action is ReleaseAction.DONE:
            log.info("gpu_release_done", elapsed_s=round(elapsed, 3), gpus=list(targets))
            return dataclasses.replace(result, ok=True, reason=decision.reason, elapsed_s=elapsed)
        if decision.action is ReleaseAction.GIVE_UP:
            log.error("gpu_release_failed", elapsed_s=round(elapsed, 3), reason=decision.reason)
            return dataclasses.replace(result, ok=False, reason=decision.reason, elapsed_s=elapsed)
        if decision.action is ReleaseAction.KILL:
            for pid in decision.kill_pids:
                killed.add(pid)
                try:
                    gone = not kill(pid)
                except PermissionError:
                    # Another user's process: not ours to kill. The wait runs out and ends in
                    # a named exit 6 rather than an internal error (exit 70) restarted forever.
                    log.error("gpu_holder_not_killable", pid=pid, reason="permission denied")
                    continue
                log.warning("gpu_holder_killed", pid=pid, already_gone=gone)
            continue
        if decision.action is ReleaseAction.RESET and resetter is not None:
            # A reset needs every NVML client gone, our own handle included (prior-art.md §7).
            sensor.close()
            for check in decision.reset_gpus:
                log.warning("gpu_reset_started", gpu=check.index, uuid=check.uuid)
                outcome = resetter.reset(check.index, check.uuid or "")
                reset_at[check.index] = clock.monotonic() - started
                if outcome.ok:
                    log.info("gpu_reset_done", gpu=check.index, detail=outcome.detail)
                else:
                    reset_failed[check.index] = outcome.detail or "reset command failed"
                    log.error("gpu_reset_failed", gpu=check.index, detail=outcome.detail)
            continue
        if decision.reason != last_reason:
            log.info("gpu_release_waiting", elapsed_s=round(elapsed, 3), reason=decision.reason)
            last_reason = decision.reason
        clock.sleep(poll_interval_s)


def _partial_result(
    *,
    checks: tuple[GpuCheck, ...],
    killed: set[int],
    reset_at: Mapping[int, float],
    d_seen: set[int],
) -> ReleaseResult:
    return ReleaseResult(
        ok=False,
        reason="",
        elapsed_s=0.0,
        checks=checks,
        killed_pids=tuple(sorted(killed)),
        reset_gpus=tuple(sorted(reset_at)),
        d_state_pids=tuple(sorted(d_seen)),
    )


def raise_if_unrecoverable(
    result: ReleaseResult, notify_status: Callable[[str], None] | None = None
) -> None:
    """Turn a failed release into GpuUnrecoverable (exit 6), telling systemd's STATUS= first.

    Raises:
        GpuUnrecoverable: a target GPU is still held after kill, wait and reset; relaunching onto
            it would fail or leak more (usually a D-state process stuck in the driver, a failed
            reset, or NVML hung: the node needs an operator, often a reboot).
    """
    if result.ok:
        return
    message = f"GPUs not released, not relaunching: {result.reason}"
    if notify_status is not None:
        notify_status(f"gpu unrecoverable: {result.reason}"[:200])
    raise GpuUnrecoverable(message)
