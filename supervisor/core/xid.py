"""What a GPU driver event means for the server: the Xid table and the decision.

Pure: a GpuEvent (core/gpu_health.py) and the server's target GPUs in, a decision out.

- An event on a GPU that is not the server's is only logged.
- An application Xid (13, 31, 43, 45, 68, 109: the program's own fault, which the Kubernetes
  device plugin ignores too) and a corrected single-bit ECC error are logged and counted.
- A critical Xid, a double-bit ECC event, a lost GPU, or a recovery action other than none on a
  target GPU: the whole group is killed, and the recovery action says what follows: none ->
  restart; GPU (or bus) reset -> reset, then relaunch; node or system reboot, Xid 79 and a lost
  GPU -> no relaunch, exit 6, a reboot is needed; drain (P2P, and reset; IMEX domain recovery)
  -> stop, exit 6.

The action followed is the stronger of the driver's (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION read
when the event arrived, or the event's own for a recovery-action event) and the table's for that
Xid: older drivers report no action, and a driver may set it only after the Xid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from supervisor.core.gpu_health import EventKind, GpuEvent, RecoveryAction

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class Verdict(str, Enum):
    """What the supervisor does about one event; the value is logged."""

    IGNORE = "ignore"  # an application Xid: logged and counted
    LOG = "log"  # corrected, informational, or on a GPU that is not the server's
    RESTART = "restart"  # kill the group, relaunch
    RESET = "reset"  # kill the group, reset the GPU, relaunch
    DRAIN = "drain"  # kill the group, no relaunch (exit 6): the operator drains the GPU
    REBOOT = "reboot"  # kill the group, no relaunch (exit 6): only a reboot brings the GPU back

    @property
    def kills(self) -> bool:
        return _SEVERITY[self] > 0

    @property
    def ends_run(self) -> bool:
        return self in (Verdict.DRAIN, Verdict.REBOOT)


_SEVERITY = {
    Verdict.IGNORE: 0,
    Verdict.LOG: 0,
    Verdict.RESTART: 1,
    Verdict.RESET: 2,
    Verdict.DRAIN: 3,
    Verdict.REBOOT: 4,
}

_ACTION_VERDICT = {
    RecoveryAction.NONE: Verdict.RESTART,
    RecoveryAction.GPU_RESET: Verdict.RESET,
    RecoveryAction.BUS_RESET: Verdict.RESET,
    RecoveryAction.DRAIN_P2P: Verdict.DRAIN,
    RecoveryAction.DRAIN_AND_RESET: Verdict.DRAIN,
    RecoveryAction.RECOVER_IMEX_DOMAIN: Verdict.DRAIN,
    RecoveryAction.NODE_REBOOT: Verdict.REBOOT,
    RecoveryAction.SYSTEM_REBOOT: Verdict.REBOOT,
}


@dataclass(frozen=True, slots=True)
class XidInfo:
    meaning: str
    # What NVIDIA's Xid catalog asks for; None: informational, nothing to do unless the driver's
    # own recovery action says otherwise.
    action: RecoveryAction | None


_APP = None  # application Xids: never acted on, whatever the action
_NONE, _RESET, _REBOOT = RecoveryAction.NONE, RecoveryAction.GPU_RESET, RecoveryAction.NODE_REBOOT

# The common Xids, from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors).
XIDS: dict[int, XidInfo] = {
    13: XidInfo("graphics engine exception, usually the application's illegal access", _APP),
    31: XidInfo("GPU memory page fault, usually the application's illegal address", _APP),
    32: XidInfo("invalid or corrupted push buffer stream", _NONE),
    38: XidInfo("driver firmware error", _RESET),
    43: XidInfo("GPU stopped processing the application's work; the GPU is fine", _APP),
    45: XidInfo("preemptive cleanup after earlier errors, e.g. killed processes", _APP),
    48: XidInfo("double-bit ECC error, an uncorrectable memory error", _RESET),
    61: XidInfo("internal micro-controller breakpoint or warning", _RESET),
    62: XidInfo("internal micro-controller halt", _RESET),
    63: XidInfo("ECC page retirement or row remap recorded; applies at the next reset", None),
    64: XidInfo("ECC page retirement or row remap recording failed", _RESET),
    68: XidInfo("NVDEC video decoder exception", _APP),
    69: XidInfo("graphics engine class error", _NONE),
    74: XidInfo("NVLink error", _RESET),
    79: XidInfo("GPU has fallen off the bus", _REBOOT),
    92: XidInfo("high rate of corrected single-bit ECC errors", None),
    # The application that hit it was stopped; the row remap it needs applies at a reset, and
    # the group is down anyway: the earliest convenient time NVIDIA asks for.
    94: XidInfo("contained ECC error: only the affected application stopped", _RESET),
    95: XidInfo("uncontained ECC error: every application on the GPU affected", _RESET),
    109: XidInfo("context switch timeout, usually the application", _APP),
    119: XidInfo("GPU firmware (GSP) RPC timeout", _RESET),
    120: XidInfo("GPU firmware (GSP) error", _RESET),
    154: XidInfo("GPU recovery action changed", None),
}
_UNKNOWN_XID = XidInfo("not in the supervisor's table; see NVIDIA's Xid catalog", _NONE)
_DBE = XidInfo("double-bit ECC error, an uncorrectable memory error", _RESET)
_SBE = XidInfo("corrected single-bit ECC error", None)
_LOST = XidInfo("GPU lost: fallen off the bus or inaccessible", _REBOOT)


def xid_info(xid: int) -> XidInfo:
    return XIDS.get(xid, _UNKNOWN_XID)


@dataclass(frozen=True, slots=True)
class XidDecision:
    """One event judged: the verdict, what the event means, the recovery action followed."""

    event: GpuEvent
    verdict: Verdict
    meaning: str
    action: RecoveryAction | None  # None: neither the driver nor the table names one
    on_target: bool

    @property
    def xid(self) -> int | None:
        return self.event.code if self.event.kind is EventKind.XID else None

    @property
    def action_name(self) -> str | None:
        return None if self.action is None else self.action.name.lower()

    def what(self) -> str:
        """'Xid 48 on GPU 0 (double-bit ECC error ...)'."""
        kind = self.event.kind
        name = {
            EventKind.XID: f"Xid {self.event.code}",
            EventKind.DOUBLE_BIT_ECC: "double-bit ECC event",
            EventKind.SINGLE_BIT_ECC: "single-bit ECC event",
            EventKind.RECOVERY_ACTION: "recovery action event",
            EventKind.GPU_LOST: "GPU lost",
        }[kind]
        return f"{name} on GPU {self.event.index} ({self.meaning})"

    def reason(self) -> str:
        """The event and what follows, in one sentence for the log, incident and exit."""
        action = f" [recovery action {self.action_name}]" if self.action is not None else ""
        then = {
            Verdict.IGNORE: "an application error: ignored",
            Verdict.LOG: "logged" if self.on_target else "not a GPU of this server: logged",
            Verdict.RESTART: "server killed, restarting it",
            Verdict.RESET: "server killed, resetting the GPU before relaunching",
            Verdict.DRAIN: "server killed, the driver asks to drain the GPU, no relaunch",
            Verdict.REBOOT: "server killed, the node needs a reboot, no relaunch",
        }[self.verdict]
        return f"{self.what()}{action}: {then}"


def _info(event: GpuEvent) -> XidInfo:
    if event.kind is EventKind.XID:
        return xid_info(event.code)
    if event.kind is EventKind.RECOVERY_ACTION:
        try:
            action = RecoveryAction(event.code)
        except ValueError:
            # A driver newer than this table asks for something: stop for the operator.
            return XidInfo(f"recovery action {event.code}, unknown here", RecoveryAction.DRAIN_P2P)
        meaning = f"the driver asks for {action.name.lower()}"
        return XidInfo(meaning, None if action is RecoveryAction.NONE else action)
    return {
        EventKind.DOUBLE_BIT_ECC: _DBE,
        EventKind.SINGLE_BIT_ECC: _SBE,
        EventKind.GPU_LOST: _LOST,
    }[event.kind]


def _stronger(a: RecoveryAction | None, b: RecoveryAction | None) -> RecoveryAction | None:
    if a is None or b is None:
        return a if b is None else b
    return a if _SEVERITY[_ACTION_VERDICT[a]] >= _SEVERITY[_ACTION_VERDICT[b]] else b


def decide(event: GpuEvent, targets: frozenset[int]) -> XidDecision:
    """The verdict on one event for a server on the `targets` GPU indices."""
    info = _info(event)
    on_target = event.index in targets
    application = event.kind is EventKind.XID and event.code in APPLICATION_XIDS
    driver = event.recovery_action
    if application or not on_target:
        verdict = Verdict.IGNORE if application and on_target else Verdict.LOG
        return XidDecision(event, verdict, info.meaning, driver, on_target)
    if info.action is None and driver in (None, RecoveryAction.NONE):
        return XidDecision(event, Verdict.LOG, info.meaning, driver, on_target)
    action = _stronger(driver, info.action)
    assert action is not None  # one of them is set: the branch above returned otherwise
    return XidDecision(event, _ACTION_VERDICT[action], info.meaning, action, on_target)


def worse(current: XidDecision | None, new: XidDecision) -> XidDecision:
    """The decision to follow after `new`: the more severe one (the earlier on a tie)."""
    if current is None or _SEVERITY[new.verdict] > _SEVERITY[current.verdict]:
        return new
    return current


XidCounts = dict[str, dict[str, int]]  # GPU index -> Xid -> count, as text (JSON object keys)


def counted(counts: Mapping[str, Mapping[str, int]], gpu: object, xid: object) -> XidCounts | None:
    """`counts` with one more `xid` on `gpu` (a `gpu_event`'s fields); None when either is not
    a plain integer (not an Xid event)."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gpu, xid)):
        return None
    new = {g: dict(per) for g, per in counts.items()}
    per = new.setdefault(str(gpu), {})
    per[str(xid)] = per.get(str(xid), 0) + 1
    return new


def read_counts(data: object) -> XidCounts:
    """Counts from JSON (status.json); anything malformed reads as none."""
    if not isinstance(data, dict):
        return {}
    return {
        str(g): {str(x): n for x, n in per.items() if isinstance(n, int)}
        for g, per in data.items()
        if isinstance(per, dict)
    }
