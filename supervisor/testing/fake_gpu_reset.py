"""`nvidia-smi --gpu-reset` for simulated GPUs: `python -m supervisor.testing.fake_gpu_reset ID...`.

The reset itself, and the historic spelling of `python -m supervisor.testing.fake_gpu reset ID...`
(kept because configs and docs name it as the reset command): same messages, same exit codes.
Each ID is an index or a UUID, or several comma-separated (`-i 0,1,2,3`, and `-r`/`--gpu-reset`,
are accepted too, as nvidia-smi takes them); the state dir is $FAKE_GPU_STATE_DIR.

As nvidia-smi -r (its manual): refused while a process uses a GPU being reset; a GPU that has
fallen off the bus (Xid 79, lost) cannot be reset, only a reboot helps; GPUs that must be reset
together (NVLink peers without per-GPU reset: before Ampere, or NVSwitch boxes without Fabric
Manager) are refused unless the command names every peer, and the error names the missing ones.
A reset frees the memory still held (stuck included), lets pending row remaps and page
retirements take effect, clears the volatile ECC counts, the recovery action and a
reset-required state (gpu_faults.reset_health). Exit codes follow nvidia-smi: 0 reset, 2 bad
argument, 6 no such GPU, 9 no driver (no state dir), 15 GPU lost, 255 in use or peers missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from supervisor.testing import gpu_faults, gpu_state

__all__ = [
    "EXIT_BAD_ARGUMENT",
    "EXIT_DRIVER_NOT_LOADED",
    "EXIT_GPU_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_OTHER",
    "main",
    "print_reset",
    "reset",
]

EXIT_OK = 0
EXIT_BAD_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_GPU_LOST = 15
EXIT_OTHER = 255

_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def _bus(gpu: gpu_state.SimGpu) -> str:
    return gpu_state.pci_bus_id(gpu.index)


def _select(
    gpus: Sequence[gpu_state.SimGpu], devices: Sequence[str]
) -> list[gpu_state.SimGpu] | None:
    """The GPUs named (indices or UUIDs, comma lists allowed), by index; None: one is unknown."""
    chosen: dict[int, gpu_state.SimGpu] = {}
    for name in (part.strip() for device in devices for part in device.split(",")):
        match = [g for g in gpus if g.uuid == name or str(g.index) == name]
        if not match:
            return None
        chosen[match[0].index] = match[0]
    return [chosen[i] for i in sorted(chosen)]


def _in_use(state_dir: Path, chosen: Sequence[gpu_state.SimGpu]) -> str | None:
    busy = [g for g in chosen if gpu_state.live_holders(state_dir, g.index)]
    if not busy:
        return None
    lines = "".join(f"  GPU {_bus(g)}: In use by another client\n" for g in busy)
    count = "1 device is" if len(busy) == 1 else f"{len(busy)} devices are"
    return (
        f"The following GPUs could not be reset:\n{lines}\n"
        f"{count} currently being used by one or more other processes (e.g., Fabric "
        "Manager, CUDA application, graphics application such as an X server, or a "
        "monitoring application such as another instance of nvidia-smi). Please first kill "
        "all processes using this device and all compute applications running in the system."
    )


def _missing_peers(
    gpus: Sequence[gpu_state.SimGpu], chosen: Sequence[gpu_state.SimGpu]
) -> str | None:
    named = {g.index for g in chosen}
    lines: list[str] = []
    for gpu in chosen:
        if gpu.per_gpu_reset:
            continue
        missing = [p for p in gpu_state.nvlink_peers(gpus, gpu) if p.index not in named]
        if missing:
            others = ", ".join(f"GPU {_bus(p)} (index {p.index})" for p in missing)
            lines.append(
                f"  GPU {_bus(gpu)} (index {gpu.index}): its NVLink peers must be reset with "
                f"it: {others}"
            )
    if not lines:
        return None
    every = sorted(
        {g.index for g in chosen}
        | {p.index for g in chosen if not g.per_gpu_reset for p in gpu_state.nvlink_peers(gpus, g)}
    )
    return (
        "The following GPUs could not be reset:\n" + "\n".join(lines) + "\n\n"
        "GPUs connected by NVLink must be reset in the same command here; reset "
        f"{','.join(map(str, every))} together."
    )


def reset(state_dir: Path | None, device: str | Sequence[str]) -> tuple[int, str]:
    """Reset the simulated GPUs named by `device` (an index or UUID, a comma list, or several):
    (exit code, what nvidia-smi would print). All or nothing: any refusal resets none."""
    if gpu_state.state_dir_problem(state_dir) is not None:
        return EXIT_DRIVER_NOT_LOADED, _NO_DRIVER
    assert state_dir is not None  # state_dir_problem(None) is a problem
    gpus = gpu_state.read_gpus(state_dir)
    chosen = _select(gpus, [device] if isinstance(device, str) else device)
    if not chosen:
        return EXIT_NOT_FOUND, "No devices were found"
    for gpu in chosen:
        if gpu_faults.read_health(state_dir, gpu.index).lost:
            return EXIT_GPU_LOST, (
                f"Unable to determine the device handle for GPU {_bus(gpu)}: GPU is lost.  "
                "Reboot the system to recover this GPU"
            )
    refusal = _in_use(state_dir, chosen) or _missing_peers(gpus, chosen)
    if refusal is not None:
        return EXIT_OTHER, refusal
    for gpu in chosen:
        gpu_state.clear_gpu(state_dir, gpu.index)
        gpu_faults.reset_health(state_dir, gpu.index)
    done = "".join(f"GPU {_bus(g)} was successfully reset.\n" for g in chosen)
    return EXIT_OK, f"{done}All done."


def print_reset(state_dir: Path | None, devices: str | Sequence[str]) -> int:
    """Run `reset` and print as nvidia-smi does; a missing state dir is also explained on stderr
    (nvidia-smi's message alone would hide a FAKE_GPU_STATE_DIR typo)."""
    code, message = reset(state_dir, devices)
    print(message, flush=True)
    problem = gpu_state.state_dir_problem(state_dir)
    if code == EXIT_DRIVER_NOT_LOADED and problem is not None:
        print(f"fake_gpu: {problem}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("-r", "--gpu-reset")]
    devices = [a for a in args if a not in ("-i", "--id")]
    if not devices or any(a.startswith("-") for a in devices):
        print("usage: python -m supervisor.testing.fake_gpu_reset [-r] [-i] INDEX|UUID[,...]")
        return EXIT_BAD_ARGUMENT
    value = os.environ.get("FAKE_GPU_STATE_DIR")
    return print_reset(Path(value) if value else None, devices)


if __name__ == "__main__":
    sys.exit(main())
