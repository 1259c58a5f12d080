"""`nvidia-smi --gpu-reset` for simulated GPUs: `python -m supervisor.testing.fake_gpu_reset ID`.

The historic spelling of `python -m supervisor.testing.fake_gpu reset ID` (supervisor/testing/
fake_gpu.py), kept because configs and docs name it as the reset command: same messages, same
exit codes. ID is an index or a UUID (`-i ID` and `-r`/`--gpu-reset` are accepted too, as
nvidia-smi takes them); the state dir is $FAKE_GPU_STATE_DIR. Exit codes follow nvidia-smi: 0
reset, 2 bad argument, 6 no such GPU, 9 no driver (no state dir), 255 in use.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from supervisor.testing.fake_gpu import (
    EXIT_BAD_ARGUMENT,
    EXIT_DRIVER_NOT_LOADED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_OTHER,
    print_reset,
    reset,
)

__all__ = [
    "EXIT_BAD_ARGUMENT",
    "EXIT_DRIVER_NOT_LOADED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_OTHER",
    "main",
    "reset",
]


def main(argv: Sequence[str] | None = None) -> int:
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("-r", "--gpu-reset")]
    if len(args) == 2 and args[0] in ("-i", "--id"):
        args = args[1:]
    if len(args) != 1:
        print("usage: python -m supervisor.testing.fake_gpu_reset [-r] [-i] INDEX|UUID")
        return EXIT_BAD_ARGUMENT
    value = os.environ.get("FAKE_GPU_STATE_DIR")
    return print_reset(Path(value) if value else None, args[0])


if __name__ == "__main__":
    sys.exit(main())
