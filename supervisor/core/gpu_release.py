"""Decide what to do next while waiting for the GPUs of a dead run to be free again (pure).

Fed with a GPU snapshot, the PIDs of the old run, process states and the used-memory baseline
measured before the first launch; returns wait / kill these PIDs / wait for D state / reset GPU i /
give up. The shell (supervisor/cleanup.py) reads, sleeps, signals and resets.

Theory of operation, per target GPU:

    snapshot ──> CLEAN          no process of the old run listed, used <= baseline + tolerance
             ──> HELD_BY_OURS   a live process of ours holds it       -> SIGKILL it (once)
             ──> HELD_D_STATE   ours, in D state (kernel unpinning)   -> wait, never re-kill
             ──> RELEASING      ours listed but gone/zombie, or memory above baseline with no
                                live holder                           -> wait, then reset
             ──> HELD_FOREIGN   a live process that is not ours       -> wait, then give up
             ──> UNKNOWN        NVML gave no answer                   -> wait, then give up

Live holders of ours are killed at once: waiting cannot help a process that is running (an orphan
that escaped the group). Everything else gets `timeout_s` (default 120 s: 243 GB pinned takes ~26 s
to unpin after SIGKILL, sglang PR #32829), D-state holders `d_state_grace_s` more; then memory
still held with no process is reset (once per GPU) and must be clean `reset_settle_s` later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from supervisor.core.readings import GpuState
from supervisor.core.units import format_bytes


class GpuCondition(Enum):
    CLEAN = "clean"
    HELD_BY_OURS = "held_by_ours"
    HELD_D_STATE = "held_d_state"
    RELEASING = "releasing"
    HELD_FOREIGN = "held_foreign"
    UNKNOWN = "unknown"


class ReleaseAction(Enum):
    DONE = "done"
    WAIT = "wait"
    KILL = "kill"
    RESET = "reset"
    GIVE_UP = "give_up"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCheck:
    """One target GPU judged against the old run and its baseline."""

    index: int
    uuid: str | None
    condition: GpuCondition
    used_bytes: int | None = None
    baseline_bytes: int = 0
    live_ours: tuple[int, ...] = ()  # alive, ours, not in D: SIGKILL them
    d_state: tuple[int, ...] = ()  # ours in D: SIGKILL is pending, the kernel is still unpinning
    gone_ours: tuple[int, ...] = ()  # still listed by NVML but exited (or zombie)
    foreign: tuple[int, ...] = ()  # alive, not ours: never killed here

    @property
    def is_clean(self) -> bool:
        return self.condition is GpuCondition.CLEAN

    def describe(self) -> str:
        """One human line: GPU, condition and the PIDs or memory behind it (sizes with units)."""
        parts = [f"GPU {self.index}: {self.condition.value}"]
        if self.used_bytes is not None:
            used, baseline = format_bytes(self.used_bytes), format_bytes(self.baseline_bytes)
            parts.append(f"used {used} (baseline {baseline})")
        for label, pids in (
            ("live pids", self.live_ours),
            ("D-state pids", self.d_state),
            ("exited pids still listed", self.gone_ours),
            ("foreign pids", self.foreign),
        ):
            if pids:
                parts.append(f"{label} {', '.join(map(str, pids))}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        """The same for programs: the bytes as integers, the line as `detail`."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "condition": self.condition.value,
            "used_bytes": self.used_bytes,
            "baseline_bytes": self.baseline_bytes,
            "live_pids": list(self.live_ours),
            "d_state_pids": list(self.d_state),
            "exited_pids": list(self.gone_ours),
            "foreign_pids": list(self.foreign),
            "detail": self.describe(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseDecision:
    """What the cleanup loop does next, and why (the reason goes to the log and the incident)."""

    action: ReleaseAction
    reason: str
    kill_pids: tuple[int, ...] = ()
    reset_gpus: tuple[GpuCheck, ...] = ()


# After an NVML query missed its deadline the worker is replaced and NVML is left alone for a
# while: every query meanwhile answers "unknown" at once (adapters/gpu_guard.py).
NVML_RETRY_MAX_S = 30.0


def nvml_retry_after_s(release_timeout_s: float, hangs_in_a_row: int) -> float:
    """How long NVML is left alone after `hangs_in_a_row` queries in a row missed their deadline.

    A quarter of the release wait at first (at most 30 s): after a short hang, a rank dying in
    the window would otherwise find every GPU "unknown" for its whole release wait and end the
    run with exit 6, though NVML answers again; this way the wait asks again about four times.
    Doubled with each further hang, up to 30 s: a driver that stays hung leaves each new worker
    stuck in D state, and asking at every tick would pile them up; this way one per 30 s at most.
    """
    first_s = min(NVML_RETRY_MAX_S, release_timeout_s / 4)
    doubled: float = first_s * 2.0 ** min(max(0, hangs_in_a_row - 1), 16)
    return min(NVML_RETRY_MAX_S, doubled)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResetOutcome:
    """Result of running the reset command for one GPU."""

    ok: bool
    detail: str = ""


def _is_alive(state: str | None) -> bool:
    return state is not None and state not in ("Z", "X", "x")


def assess_gpu(
    index: int,
    gpu: GpuState | None,
    *,
    ours: frozenset[int],
    states: Mapping[int, str | None],
    baseline_bytes: int,
    tolerance_bytes: int,
) -> GpuCheck:
    """Judge one target GPU. `states`: each listed PID's /proc state letter, or None when gone.

    A PID NVML lists that is not ours and not visible in /proc is ignored: in a container without
    the host PID namespace every listed PID looks like that, so only memory can decide there.
    """
    if gpu is None:
        return GpuCheck(index=index, uuid=None, condition=GpuCondition.UNKNOWN)
    live: list[int] = []
    d_state: list[int] = []
    gone: list[int] = []
    foreign: list[int] = []
    for proc in gpu.processes:
        state = states.get(proc.pid)
        if proc.pid in ours:
            if state == "D":
                d_state.append(proc.pid)
            elif _is_alive(state):
                live.append(proc.pid)
            else:
                gone.append(proc.pid)
        elif _is_alive(state):
            foreign.append(proc.pid)
    over_baseline = gpu.used_bytes > baseline_bytes + tolerance_bytes
    if live:
        condition = GpuCondition.HELD_BY_OURS
    elif d_state:
        condition = GpuCondition.HELD_D_STATE
    elif gone:
        condition = GpuCondition.RELEASING
    elif over_baseline:
        condition = GpuCondition.HELD_FOREIGN if foreign else GpuCondition.RELEASING
    else:
        condition = GpuCondition.CLEAN
    return GpuCheck(
        index=index,
        uuid=gpu.uuid,
        condition=condition,
        used_bytes=gpu.used_bytes,
        baseline_bytes=baseline_bytes,
        live_ours=tuple(live),
        d_state=tuple(d_state),
        gone_ours=tuple(gone),
        foreign=tuple(foreign),
    )


def assess_gpus(
    gpus: Sequence[GpuState] | None,
    targets: Iterable[int],
    *,
    ours: frozenset[int],
    states: Mapping[int, str | None],
    baselines: Mapping[str, int],
    tolerance_bytes: int,
) -> tuple[GpuCheck, ...]:
    """Judge every target GPU of a snapshot (None: NVML gave no answer). Baselines by UUID."""
    by_index = {g.index: g for g in gpus} if gpus is not None else {}
    checks = []
    for index in targets:
        gpu = by_index.get(index)
        baseline = baselines.get(gpu.uuid, 0) if gpu is not None else 0
        checks.append(
            assess_gpu(
                index,
                gpu,
                ours=ours,
                states=states,
                baseline_bytes=baseline,
                tolerance_bytes=tolerance_bytes,
            )
        )
    return tuple(checks)


def _summary(checks: Iterable[GpuCheck]) -> str:
    return " | ".join(c.describe() for c in checks)


def decide_release(
    checks: Sequence[GpuCheck],
    *,
    elapsed_s: float,
    timeout_s: float,
    d_state_grace_s: float,
    killed_pids: frozenset[int],
    reset_available: bool,
    reset_at_s: Mapping[int, float],
    reset_failed: Mapping[int, str],
    reset_settle_s: float,
) -> ReleaseDecision:
    """Next step of the release wait; first matching rule wins (see the module docstring)."""
    dirty = [c for c in checks if not c.is_clean]
    if not dirty:
        return ReleaseDecision(action=ReleaseAction.DONE, reason="all target GPUs are free")
    to_kill = tuple(sorted({pid for c in dirty for pid in c.live_ours if pid not in killed_pids}))
    if to_kill:
        return ReleaseDecision(
            action=ReleaseAction.KILL,
            reason=f"processes of the old run still hold GPUs: {_summary(dirty)}",
            kill_pids=to_kill,
        )
    for c in dirty:
        if c.index in reset_failed:
            return ReleaseDecision(
                action=ReleaseAction.GIVE_UP,
                reason=f"GPU {c.index} reset failed: {reset_failed[c.index]}",
            )
    if elapsed_s < timeout_s:
        return ReleaseDecision(
            action=ReleaseAction.WAIT, reason=f"waiting for release: {_summary(dirty)}"
        )
    held = _after_timeout(dirty, elapsed_s, timeout_s, d_state_grace_s)
    if held is not None:
        return held
    # Only RELEASING is left: memory held with no live process.
    return _reset_step(dirty, elapsed_s, timeout_s, reset_available, reset_at_s, reset_settle_s)


def _after_timeout(
    dirty: Sequence[GpuCheck], elapsed_s: float, timeout_s: float, d_state_grace_s: float
) -> ReleaseDecision | None:
    """Past the timeout: unknown, surviving, D-state and foreign holders; None for RELEASING."""

    def having(condition: GpuCondition) -> list[GpuCheck]:
        return [c for c in dirty if c.condition is condition]

    if unknown := having(GpuCondition.UNKNOWN):
        return ReleaseDecision(
            action=ReleaseAction.GIVE_UP,
            reason=f"GPU state unknown after {timeout_s:g} s (NVML hung or GPU missing): "
            + ", ".join(str(c.index) for c in unknown),
        )
    if survivors := having(GpuCondition.HELD_BY_OURS):
        return ReleaseDecision(
            action=ReleaseAction.GIVE_UP,
            reason=f"processes survived SIGKILL: {_summary(survivors)}",
        )
    if d_held := having(GpuCondition.HELD_D_STATE):
        if elapsed_s < timeout_s + d_state_grace_s:
            return ReleaseDecision(
                action=ReleaseAction.WAIT,
                reason=f"D-state holders cannot be killed, waiting: {_summary(d_held)}",
            )
        return ReleaseDecision(
            action=ReleaseAction.GIVE_UP,
            reason=f"still in D state after {timeout_s + d_state_grace_s:g} s: " + _summary(d_held),
        )
    if foreign := having(GpuCondition.HELD_FOREIGN):
        return ReleaseDecision(
            action=ReleaseAction.GIVE_UP,
            reason=f"foreign processes hold target GPUs: {_summary(foreign)}",
        )
    return None


def _reset_step(
    dirty: Sequence[GpuCheck],
    elapsed_s: float,
    timeout_s: float,
    reset_available: bool,
    reset_at_s: Mapping[int, float],
    reset_settle_s: float,
) -> ReleaseDecision:
    """Memory held with no live process: reset each GPU once, let it settle, then judge."""
    if not reset_available:
        return ReleaseDecision(
            action=ReleaseAction.GIVE_UP,
            reason=f"GPU memory still held after {timeout_s:g} s and no gpu reset_command is "
            f"configured: {_summary(dirty)}",
        )
    fresh = tuple(c for c in dirty if c.index not in reset_at_s)
    if fresh:
        return ReleaseDecision(
            action=ReleaseAction.RESET,
            reason=f"memory held with no process, resetting: {_summary(fresh)}",
            reset_gpus=fresh,
        )
    if any(elapsed_s - reset_at_s[c.index] < reset_settle_s for c in dirty):
        return ReleaseDecision(
            action=ReleaseAction.WAIT, reason=f"checking again after reset: {_summary(dirty)}"
        )
    return ReleaseDecision(
        action=ReleaseAction.GIVE_UP, reason=f"still dirty after reset: {_summary(dirty)}"
    )
