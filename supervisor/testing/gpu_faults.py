"""Sick simulated GPUs: each GPU's health in FAKE_GPU_STATE_DIR, and the faults that make it so.

Written from NVML's documented behaviour (nvml.h, the nvidia-smi manual), in pynvml's values:

    health/gpu<I>.json  {"lost", "reset_required", "remapped_rows": [corr, unc, pending, failure],
                         "retired_pages_pending", "ecc": {"volatile": [corrected, uncorrected],
                         "aggregate": [...]}, "persistence", "fabric_state", "recovery_action",
                         "unsupported": [NAME, ...]}       absent (or damaged): a healthy GPU

A health file is replaced atomically under the state dir's lock (gpu_events.locked), so an
injection and a reset never lose each other's change. The driver's events go to the queue in
supervisor/testing/gpu_events.py; one injection (FAULTS: `python -m supervisor.testing.fake_gpu
inject`, the scenario's `gpu_fault`) queues at most one event, so a test knows exactly what a
watcher receives.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from supervisor.testing import gpu_events, gpu_state

XID_FALLEN_OFF_THE_BUS = 79
XID_DOUBLE_BIT_ECC = 48

# "gpu-reset" -> NVML_GPU_RECOVERY_ACTION_GPU_RESET, ...; "reboot" is short for node-reboot.
RECOVERY_ACTIONS: dict[str, int] = dict(
    sorted(
        (
            (name.removeprefix("NVML_GPU_RECOVERY_ACTION_").lower().replace("_", "-"), value)
            for name, value in vars(pynvml).items()
            if name.startswith("NVML_GPU_RECOVERY_ACTION_")
        ),
        key=lambda named: int(named[1]),
    )
)
RECOVERY_ACTIONS["reboot"] = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT


@dataclass(frozen=True, slots=True, kw_only=True)
class SimHealth:
    """One simulated GPU's health, in the shapes pynvml returns."""

    lost: bool = False  # NVML_ERROR_GPU_IS_LOST from every call on it (fallen off the bus)
    reset_required: bool = False  # NVML_ERROR_RESET_REQUIRED from every call on it
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    retired_pages_pending: bool = False
    ecc: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"volatile": (0, 0), "aggregate": (0, 0)}
    )  # counter -> (corrected, uncorrected)
    persistence: bool = True
    fabric_state: int | None = None  # None: COMPLETED on an NVSwitch fabric, else NOT_SUPPORTED
    recovery_action: int = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    unsupported: tuple[str, ...] = ()  # pynvml names that raise NVMLError_NotSupported

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SimHealth:
        """Raises KeyError/TypeError/ValueError/IndexError on what `to_json` did not write."""
        corr, unc, pending, failure = (int(n) for n in raw["remapped_rows"])
        return cls(
            lost=bool(raw["lost"]),
            reset_required=bool(raw["reset_required"]),
            remapped_rows=(corr, unc, pending, failure),
            retired_pages_pending=bool(raw["retired_pages_pending"]),
            ecc={str(k): (int(v[0]), int(v[1])) for k, v in raw["ecc"].items()},
            persistence=bool(raw["persistence"]),
            fabric_state=None if raw["fabric_state"] is None else int(raw["fabric_state"]),
            recovery_action=int(raw["recovery_action"]),
            unsupported=tuple(str(name) for name in raw["unsupported"]),
        )

    def faults(self) -> list[str]:
        """What is wrong, in the words of the inject command (empty when healthy)."""
        _corr, _unc, pending, failure = self.remapped_rows
        named = {
            "lost": self.lost,
            "reset-required": self.reset_required,
            "remap-pending": bool(pending),
            "remap-failed": bool(failure),
            "retired-pending": self.retired_pages_pending,
            f"dbe {self.ecc['volatile'][1]}": bool(self.ecc["volatile"][1]),
            "persistence-off": not self.persistence,
            "fabric-incomplete": self.fabric_state not in (None, *_FABRIC_FINE),
        }
        out = [name for name, on in named.items() if on]
        if self.recovery_action != pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
            out.append(f"recovery-action {action_name(self.recovery_action)}")
        out.extend(f"unsupported {name}" for name in self.unsupported)
        return out


_FABRIC_FINE = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)


def action_name(action: int) -> str:
    return next((k for k, v in RECOVERY_ACTIONS.items() if v == action), str(action))


def _health_path(state_dir: Path, gpu_index: int) -> Path:
    return state_dir / gpu_state.HEALTH_DIR / f"gpu{gpu_index}.json"


def read_health(state_dir: Path, gpu_index: int) -> SimHealth:
    """GPU `gpu_index`'s health; a missing (or damaged) file is a healthy GPU."""
    try:
        raw = json.loads(_health_path(state_dir, gpu_index).read_text())
        return SimHealth.from_json(raw)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return SimHealth()  # never written, or not by us: a healthy GPU


def update_health(
    state_dir: Path, gpu_index: int, change: Callable[[SimHealth], SimHealth]
) -> SimHealth:
    """Apply `change` to GPU `gpu_index`'s health (read, change, replace, under the lock)."""
    with gpu_events.locked(state_dir):
        health = change(read_health(state_dir, gpu_index))
        path = _health_path(state_dir, gpu_index)
        path.parent.mkdir(exist_ok=True)
        gpu_state.write_json_atomic(path, health.to_json())
        return health


def reset_health(state_dir: Path, gpu_index: int) -> None:
    """What a GPU reset repairs: pending remaps and page retirements take effect, volatile ECC
    counts and the recovery action clear, a reset-required GPU works again."""

    def repaired(h: SimHealth) -> SimHealth:
        corr, unc, _pending, failure = h.remapped_rows
        return dataclasses.replace(
            h,
            reset_required=False,
            remapped_rows=(corr, unc, 0, failure),
            retired_pages_pending=False,
            ecc={**h.ecc, "volatile": (0, 0)},
            recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_NONE,
        )

    update_health(state_dir, gpu_index, repaired)


class FaultError(ValueError):
    """An injection names an unknown fault or a bad value (the message says which)."""


def _xid(h: SimHealth, code: int) -> SimHealth:
    if code == XID_FALLEN_OFF_THE_BUS:
        return dataclasses.replace(h, lost=True)
    if code == XID_DOUBLE_BIT_ECC:  # an uncorrectable ECC error: the driver asks for a reset
        return dataclasses.replace(
            _count_ecc(h, uncorrected=True),
            recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
        )
    return h


def _count_ecc(h: SimHealth, *, uncorrected: bool) -> SimHealth:
    def bump(counts: tuple[int, int]) -> tuple[int, int]:
        return (counts[0], counts[1] + 1) if uncorrected else (counts[0] + 1, counts[1])

    return dataclasses.replace(h, ecc={k: bump(v) for k, v in h.ecc.items()})


def _remap(h: SimHealth, *, failed: bool) -> SimHealth:
    corr, unc, pending, failure = h.remapped_rows
    if failed:
        return dataclasses.replace(h, remapped_rows=(corr, unc, pending, 1))
    return dataclasses.replace(h, remapped_rows=(corr, unc + 1, 1, failure))


def _parse_xid(value: str) -> int:
    if not value.isdigit():
        raise FaultError(f"xid: not an Xid number: {value!r} (e.g. 79, 48, 13)")
    return int(value)


def _parse_action(value: str) -> int:
    if value.isdigit() and int(value) in RECOVERY_ACTIONS.values():
        return int(value)
    if value not in RECOVERY_ACTIONS:
        raise FaultError(
            f"recovery-action: unknown action {value!r}; one of {', '.join(RECOVERY_ACTIONS)}"
        )
    return RECOVERY_ACTIONS[value]


def _parse_call(value: str) -> str:
    """A pynvml name a driver may not support: a per-device call, an event type, a field id."""
    known = hasattr(pynvml, value) and (
        (value.startswith("nvmlDevice") and callable(getattr(pynvml, value)))
        or value.startswith(("nvmlEventType", "NVML_FI_"))
    )
    if not known:
        raise FaultError(
            f"unsupported: {value!r} is not a pynvml per-device call (nvmlDevice...), "
            "event type (nvmlEventType...) or field id (NVML_FI_...)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Fault:
    help: str
    metavar: str | None  # the value it takes (XID, ACTION, NAME), or None
    change: Callable[[SimHealth, str], SimHealth]
    event: Callable[[str], tuple[int, int] | None] = lambda _value: None  # (type, data)


FAULTS: dict[str, Fault] = {
    "xid": Fault(
        "an Xid event; 79 also loses the GPU, 48 (a DBE) also counts an uncorrectable ECC "
        "error and sets the recovery action to gpu-reset",
        "XID",
        lambda h, v: _xid(h, _parse_xid(v)),
        lambda v: (pynvml.nvmlEventTypeXidCriticalError, _parse_xid(v)),
    ),
    "dbe": Fault(
        "a double-bit ECC event, counted as an uncorrectable error (volatile and aggregate)",
        None,
        lambda h, _v: _count_ecc(h, uncorrected=True),
        lambda _v: (pynvml.nvmlEventTypeDoubleBitEccError, 0),
    ),
    "sbe": Fault(
        "a single-bit ECC event, counted as a corrected error",
        None,
        lambda h, _v: _count_ecc(h, uncorrected=False),
        lambda _v: (pynvml.nvmlEventTypeSingleBitEccError, 0),
    ),
    "remap-pending": Fault(
        "a row remap waiting for a reset", None, lambda h, _v: _remap(h, failed=False)
    ),
    "remap-failed": Fault(
        "a row that could not be remapped", None, lambda h, _v: _remap(h, failed=True)
    ),
    "retired-pending": Fault(
        "a page retirement waiting for a reset",
        None,
        lambda h, _v: dataclasses.replace(h, retired_pages_pending=True),
    ),
    "persistence-off": Fault(
        "persistence mode disabled", None, lambda h, _v: dataclasses.replace(h, persistence=False)
    ),
    "fabric-incomplete": Fault(
        "the NVSwitch fabric not started (state NOT_STARTED)",
        None,
        lambda h, _v: dataclasses.replace(h, fabric_state=pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED),
    ),
    "recovery-action": Fault(
        f"the driver asks for ACTION ({', '.join(RECOVERY_ACTIONS)}), with its event",
        "ACTION",
        lambda h, v: dataclasses.replace(h, recovery_action=_parse_action(v)),
        lambda v: (pynvml.nvmlEventTypeGpuRecoveryAction, _parse_action(v)),
    ),
    "lost": Fault(
        "fallen off the bus, without an event: every call raises GPU_IS_LOST",
        None,
        lambda h, _v: dataclasses.replace(h, lost=True),
    ),
    "reset-required": Fault(
        "every call raises RESET_REQUIRED until a reset",
        None,
        lambda h, _v: dataclasses.replace(h, reset_required=True),
    ),
    "unsupported": Fault(
        "an old driver: the pynvml call, event type or field NAME raises NOT_SUPPORTED",
        "NAME",
        lambda h, v: dataclasses.replace(
            h, unsupported=tuple(sorted({*h.unsupported, _parse_call(v)}))
        ),
    ),
    "clear": Fault("healthy again (the event history stays)", None, lambda _h, _v: SimHealth()),
}


def inject(state_dir: Path, gpu_index: int, fault: str, value: str | None = None) -> SimHealth:
    """Put `fault` (a FAULTS key, with its value when it takes one) on GPU `gpu_index`.

    Raises:
        FaultError: an unknown fault, a missing or bad value, or no such GPU.
    """
    spec = FAULTS.get(fault)
    if spec is None:
        raise FaultError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    if (spec.metavar is None) != (value is None):
        wanted = f"takes {spec.metavar}" if spec.metavar else "takes no value"
        raise FaultError(f"{fault}: {wanted}")
    if all(g.index != gpu_index for g in gpu_state.read_gpus(state_dir)):
        raise FaultError(f"no GPU {gpu_index} in {state_dir}")
    text = value or ""
    event = spec.event(text)  # parses the value before anything changes
    health = update_health(state_dir, gpu_index, lambda h: spec.change(h, text))
    if event is not None:
        gpu_events.append_event(state_dir, gpu_index, *event)
    return health
