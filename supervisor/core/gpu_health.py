"""GPU health as NVML reports it: the readings (one GPU's health, one driver event) and the
recovery actions the driver can ask for. Pure types; the decisions built on them live beside
them (the pre-launch gate) and in core/xid.py (what a driver event means for the server).

Every field that a driver may not support is `None` when unknown (NVML_ERROR_NOT_SUPPORTED, an
old driver, a call missing from the library): unknown is never a failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class RecoveryAction(Enum):
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's values (nvml.h NVML_GPU_RECOVERY_ACTION_*)."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7


class FabricState(Enum):
    """nvmlDeviceGetGpuFabricInfo's state (NVML_GPU_FABRIC_STATE_*): NVSwitch boxes only."""

    NOT_SUPPORTED = 0  # no NVSwitch fabric: nothing to wait for
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


class EventKind(Enum):
    """The driver events the supervisor registers for (nvmlEventType*)."""

    XID = "xid"  # nvmlEventTypeXidCriticalError; `code` is the Xid
    DOUBLE_BIT_ECC = "dbe"  # nvmlEventTypeDoubleBitEccError
    SINGLE_BIT_ECC = "sbe"  # nvmlEventTypeSingleBitEccError
    RECOVERY_ACTION = "recovery_action"  # nvmlEventTypeGpuRecoveryAction; `code` the action
    # Not an event type: nvmlEventSetWait_v2 raised NVML_ERROR_GPU_IS_LOST and this GPU's own
    # calls raise it too (fallen off the bus, as Xid 79 reports).
    GPU_LOST = "lost"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuHealth:
    """One GPU's health at one moment; None: the driver could not say."""

    index: int
    uuid: str
    lost: bool = False  # NVML_ERROR_GPU_IS_LOST on this GPU (fallen off the bus)
    reset_required: bool = False  # NVML_ERROR_RESET_REQUIRED on this GPU
    volatile_dbe: int | None = None  # uncorrectable (double-bit) ECC errors since boot
    remap_pending: bool | None = None  # row remapping waits for a reset
    remap_failed: bool | None = None  # a row could not be remapped
    retired_pages_pending: bool | None = None  # page retirement waits for a reset
    persistence_on: bool | None = None
    fabric: FabricState | None = None
    recovery_action: RecoveryAction | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuEvent:
    """One driver event on one GPU, as nvmlEventSetWait_v2 returned it."""

    index: int
    uuid: str
    kind: EventKind
    code: int  # the Xid for XID, the action for RECOVERY_ACTION, 0 otherwise
    at_s: float  # wall clock (epoch seconds) when the supervisor's worker received it
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION read when the event arrived (None: not supported)
    recovery_action: RecoveryAction | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthSnapshot:
    """One health read of every visible GPU, what NVML could not say, and the NVLink links."""

    gpus: tuple[GpuHealth, ...]
    # (field, NVML's reason) for each GpuHealth field some GPU could not report; first reason.
    unknown: tuple[tuple[str, str], ...] = ()
    # Index pairs (low, high) connected by NVLink peer-to-peer; None: NVML could not say.
    nvlink: tuple[tuple[int, int], ...] | None = None

    def get(self, index: int) -> GpuHealth | None:
        return next((g for g in self.gpus if g.index == index), None)


# -- the pre-launch gate: pure decisions on the readings above ------------------------------

HEALTH_MODES = ("enforce", "warn", "off")


class Verdict(Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"  # a fact NVML did not report: shown, never a failure


class Remedy(Enum):
    """What clears a failing GPU; the most drastic one needed wins."""

    NONE = "none"
    RESET = "reset"  # a GPU reset ([gpu] reset_command) applies or clears it
    OPERATOR = "operator"  # service, the fabric manager, a drain: not the supervisor's to do
    REBOOT = "reboot"  # a reset cannot help (lost GPU, Xid 79; the driver asks for a reboot)


_SEVERITY = (Remedy.NONE, Remedy.RESET, Remedy.OPERATOR, Remedy.REBOOT)

_ACTION_REMEDY = {
    RecoveryAction.GPU_RESET: Remedy.RESET,
    RecoveryAction.BUS_RESET: Remedy.RESET,
    RecoveryAction.DRAIN_AND_RESET: Remedy.RESET,  # nothing runs on it before a launch
    RecoveryAction.NODE_REBOOT: Remedy.REBOOT,
    RecoveryAction.SYSTEM_REBOOT: Remedy.REBOOT,
    RecoveryAction.DRAIN_P2P: Remedy.OPERATOR,
    RecoveryAction.RECOVER_IMEX_DOMAIN: Remedy.OPERATOR,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuVerdict:
    """The gate's judgement of one GPU: the verdict, why, and what would clear a failure."""

    index: int
    uuid: str
    verdict: Verdict
    reasons: tuple[str, ...] = ()  # the failures, else the warnings
    remedy: Remedy = Remedy.NONE
    unknown: tuple[str, ...] = ()  # facts NVML did not report
    health: GpuHealth | None = None  # the readings judged (None: none for this GPU)

    @property
    def needs_reset(self) -> bool:
        """Failing, and a reset of the GPU is all it takes."""
        return self.verdict is Verdict.FAIL and self.remedy is Remedy.RESET

    def describe(self, reset_offer: str = "") -> str:
        """One line: GPU, UUID, verdict and reasons, with the way out for a failure."""
        head = f"GPU {self.index} ({self.uuid or 'uuid unknown'}): {self.verdict.value}"
        parts = list(self.reasons)
        if self.unknown:
            parts.append("not reported: " + ", ".join(self.unknown))
        text = f"{head}: {'; '.join(parts)}" if parts else f"{head}: healthy"
        if self.needs_reset:
            text += f"; {reset_offer}" if reset_offer else "; reset the GPU or reboot the node"
        elif self.remedy is Remedy.REBOOT:
            text += "; reboot the node"
        return text

    def to_json(self) -> dict[str, object]:
        """For the `gpu_health` event and incident files: the verdict and the readings."""
        health = self.health
        return {
            "gpu": self.index,
            "uuid": self.uuid,
            "verdict": self.verdict.value,
            "reason": "; ".join(self.reasons),
            "remedy": self.remedy.value,
            "unknown": list(self.unknown),
            "lost": None if health is None else health.lost,
            "reset_required": None if health is None else health.reset_required,
            "volatile_dbe": None if health is None else health.volatile_dbe,
            "remap_pending": None if health is None else health.remap_pending,
            "remap_failed": None if health is None else health.remap_failed,
            "retired_pages_pending": None if health is None else health.retired_pages_pending,
            "persistence_on": None if health is None else health.persistence_on,
            "fabric": _name(health.fabric if health is not None else None),
            "recovery_action": _name(health.recovery_action if health is not None else None),
        }


def _name(value: Enum | None) -> str | None:
    return None if value is None else value.name.lower()


def _failures(health: GpuHealth, max_volatile_dbe: int) -> list[tuple[str, Remedy]]:
    """Every reason this GPU must not be launched on, with what would clear it."""
    out: list[tuple[str, Remedy]] = []
    if health.lost:
        lost = "lost (fallen off the bus, Xid 79): a reset cannot bring it back"
        out.append((lost, Remedy.REBOOT))
    if health.reset_required:
        out.append(("NVML says the GPU needs a reset", Remedy.RESET))
    dbe = health.volatile_dbe
    if dbe is not None and dbe > max_volatile_dbe:
        out.append(
            (
                f"{dbe} uncorrectable ECC error(s) since the driver loaded or the last reset "
                f"(gpu max_volatile_dbe {max_volatile_dbe})",
                Remedy.RESET,
            )
        )
    if health.remap_failed:
        failed = "row remapping failed: its memory cannot be repaired (service)"
        out.append((failed, Remedy.OPERATOR))
    if health.remap_pending:
        out.append(("a row remap is pending: needs a reset", Remedy.RESET))
    if health.retired_pages_pending:
        out.append(("a page retirement is pending: needs a reset", Remedy.RESET))
    if health.fabric in (FabricState.NOT_STARTED, FabricState.IN_PROGRESS):
        state = health.fabric.name.lower().replace("_", " ")
        out.append(
            (f"NVLink fabric {state}, not completed (is nvidia-fabricmanager up?)", Remedy.OPERATOR)
        )
    action = health.recovery_action
    if action is not None and action is not RecoveryAction.NONE:
        name = action.name.lower().replace("_", " ")
        out.append((f"the driver asks for recovery: {name}", _ACTION_REMEDY[action]))
    return out


def _unknown(health: GpuHealth) -> tuple[str, ...]:
    """The facts the gate could not check. Ampere and newer repair memory by row remapping and
    report page retirement as not supported, older GPUs the reverse: either one answers "is a
    repair pending". The recovery action is newer than most drivers: its absence is no gap."""
    missing = []
    if health.volatile_dbe is None:
        missing.append("uncorrectable ECC count")
    if health.remap_pending is None and health.retired_pages_pending is None:
        missing.append("pending memory repair")
    if health.persistence_on is None:
        missing.append("persistence mode")
    if health.fabric is None:
        missing.append("NVLink fabric state")
    return tuple(missing)


def judge_gpu(health: GpuHealth, *, max_volatile_dbe: int = 0) -> GpuVerdict:
    """fail > warn > unknown > ok. Unknown facts are listed, never failed on."""
    failures = _failures(health, max_volatile_dbe)
    unknown = () if health.lost else _unknown(health)  # a lost GPU answers nothing
    reasons: tuple[str, ...] = ()
    verdict, remedy = Verdict.UNKNOWN if unknown else Verdict.OK, Remedy.NONE
    if failures:
        verdict, reasons = Verdict.FAIL, tuple(text for text, _ in failures)
        remedy = max((r for _, r in failures), key=_SEVERITY.index)
    elif health.persistence_on is False:
        verdict = Verdict.WARN
        reasons = ("persistence mode off (nvidia-smi -pm 1 or nvidia-persistenced): slower starts",)
    return GpuVerdict(
        index=health.index,
        uuid=health.uuid,
        verdict=verdict,
        reasons=reasons,
        remedy=remedy,
        unknown=unknown,
        health=health,
    )


def gate_status(verdict: GpuVerdict, mode: str) -> str:
    """The pre-flight check's status (ok | warn | fail) for a verdict under `[gpu] health`:
    unknown warns, as every check that could not look does; `warn` turns failures into
    warnings."""
    if verdict.verdict is Verdict.FAIL:
        return "fail" if mode == "enforce" else "warn"
    return "ok" if verdict.verdict is Verdict.OK else "warn"


def judge_gpus(
    snapshot: HealthSnapshot, targets: Sequence[int], *, max_volatile_dbe: int = 0
) -> tuple[GpuVerdict, ...]:
    """Each target GPU judged; one the read did not cover is unknown."""
    verdicts = []
    for index in targets:
        health = snapshot.get(index)
        if health is None:
            verdicts.append(
                GpuVerdict(index=index, uuid="", verdict=Verdict.UNKNOWN, unknown=("its health",))
            )
        else:
            verdicts.append(judge_gpu(health, max_volatile_dbe=max_volatile_dbe))
    return tuple(verdicts)


def nvlink_peer_sets(
    indices: Sequence[int], nvlink: Sequence[tuple[int, int]] | None
) -> tuple[tuple[int, ...], ...]:
    """The GPUs to reset grouped into whole NVLink peer sets: each group is every GPU connected
    to one of them, directly or through others (an NVSwitch box: all of them). NVML could not
    say (None): each GPU on its own."""
    if nvlink is None:
        return tuple((i,) for i in sorted(set(indices)))
    links: dict[int, set[int]] = {}
    for a, b in nvlink:
        links.setdefault(a, set()).add(b)
        links.setdefault(b, set()).add(a)
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for start in sorted(set(indices)):
        if start in seen:
            continue
        group, todo = {start}, [start]
        while todo:
            for peer in links.get(todo.pop(), ()):
                if peer not in group:
                    group.add(peer)
                    todo.append(peer)
        seen |= group
        groups.append(tuple(sorted(group)))
    return tuple(groups)


# -- the gate in status.json: each GPU's verdict at the last `gpu_health` event --------------

HealthLines = dict[str, dict[str, str]]  # GPU index (as text) -> {"verdict", "reason"}


def health_lines(event: Mapping[str, Any], previous: HealthLines) -> HealthLines:
    """The verdicts a `gpu_health` event carries, by GPU; `previous` when it carries none."""
    lines: HealthLines = {}
    for gpu in event.get("gpus") or ():
        if not isinstance(gpu, dict):
            continue
        index, verdict = gpu.get("gpu"), gpu.get("verdict")
        if isinstance(index, int) and not isinstance(index, bool) and isinstance(verdict, str):
            unknown = gpu.get("unknown")
            missing = ", ".join(map(str, unknown)) if isinstance(unknown, list) else ""
            reason = str(gpu.get("reason") or (f"not reported: {missing}" if missing else ""))
            lines[str(index)] = {"verdict": verdict, "reason": reason}
    return lines or previous


def read_health_lines(data: object) -> HealthLines:
    """The verdicts from JSON (status.json); anything malformed reads as none."""
    if not isinstance(data, dict):
        return {}
    return {
        str(g): {"verdict": str(v.get("verdict", "")), "reason": str(v.get("reason", ""))}
        for g, v in data.items()
        if isinstance(v, dict)
    }
