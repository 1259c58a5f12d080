"""GPU health as NVML reports it: the readings (one GPU's health, one driver event) and the
recovery actions the driver can ask for. Pure types; the decisions built on them live beside
them (the pre-launch gate) and in core/xid.py (what a driver event means for the server).

Every field that a driver may not support is `None` when unknown (NVML_ERROR_NOT_SUPPORTED, an
old driver, a call missing from the library): unknown is never a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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
