"""`nvidia-smi --gpu-reset` for simulated GPUs: `python -m supervisor.testing.fake_gpu_reset ID`.

ID is an index or a UUID (`-i ID` and `-r`/`--gpu-reset` are accepted too, as nvidia-smi takes
them). Clears every holding on the GPU (stuck memory included) unless a live process still holds
it; then it refuses with nvidia-smi's message and exit code 255. Exit codes follow nvidia-smi:
0 reset, 2 bad argument, 6 no such GPU, 9 no driver (no state dir), 255 in use.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from supervisor.testing import gpu_state

EXIT_OK = 0
EXIT_BAD_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_OTHER = 255


def _bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"


def reset(state_dir: Path | None, device: str) -> tuple[int, str]:
    """Reset simulated GPU `device` (index or UUID): (exit code, what nvidia-smi would print)."""
    if state_dir is None or not (state_dir / gpu_state.GPUS_FILE).is_file():
        return EXIT_DRIVER_NOT_LOADED, (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running."
        )
    gpus = gpu_state.read_gpus(state_dir)
    match = [g for g in gpus if g.uuid == device or str(g.index) == device]
    if not match:
        return EXIT_NOT_FOUND, "No devices were found"
    gpu = match[0]
    holders = gpu_state.live_holders(state_dir, gpu.index)
    if holders:
        return EXIT_OTHER, (
            "The following GPUs could not be reset:\n"
            f"  GPU {_bus_id(gpu.index)}: In use by another client\n\n"
            "1 device is currently being used by one or more other processes (e.g., Fabric "
            "Manager, CUDA application, graphics application such as an X server, or a "
            "monitoring application such as another instance of nvidia-smi). Please first kill "
            "all processes using this device and all compute applications running in the system."
        )
    gpu_state.clear_gpu(state_dir, gpu.index)
    return EXIT_OK, f"GPU {_bus_id(gpu.index)} was successfully reset.\nAll done."


def main(argv: Sequence[str] | None = None) -> int:
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("-r", "--gpu-reset")]
    if len(args) == 2 and args[0] in ("-i", "--id"):
        args = args[1:]
    if len(args) != 1:
        print("usage: python -m supervisor.testing.fake_gpu_reset [-r] [-i] INDEX|UUID")
        return EXIT_BAD_ARGUMENT
    value = os.environ.get("FAKE_GPU_STATE_DIR")
    code, message = reset(Path(value) if value else None, args[0])
    print(message, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
