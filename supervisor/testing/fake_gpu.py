"""Simulated GPUs from the command line: `python -m supervisor.testing.fake_gpu COMMAND ...`.

    create N [--dir DIR] [--total-bytes SIZE] [--numa-nodes K] [--name NAME]
        make (or replace) a state dir with N idle GPUs spread evenly over K NUMA nodes (SIZE in
        bytes, or with a unit: 143771MiB, 141GiB); then print them as `list` does
    reset INDEX|UUID [--dir DIR]
        `nvidia-smi --gpu-reset -i ID`: clears every holding on the GPU (stuck memory included)
        unless a live process still holds it. nvidia-smi's messages and exit codes: 0 reset,
        6 no such GPU, 9 no driver (DIR holds no gpus.json), 255 in use
    list [--dir DIR] [--json]
        every GPU (index, UUID, name, NUMA node, total and used memory) and its holders: a PID
        while it is listed, "no pid" for memory stuck until a reset

DIR defaults to $FAKE_GPU_STATE_DIR. Bad input (an unknown command, no DIR at all, a count that
is not an integer, a bad size) exits 2 with argparse's usage line, never a traceback.
`python -m supervisor.testing.fake_gpu_reset ID` stays as an alias of `reset`.

Each command is a (parser builder, handler) pair in COMMANDS, so fault injections (Xid, ECC)
join as more subcommands without touching the others.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from supervisor.testing import gpu_state

EXIT_OK = 0
EXIT_BAD_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_OTHER = 255

PROG = "python -m supervisor.testing.fake_gpu"
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_MiB = 1 << 20


def _bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"


def reset(state_dir: Path | None, device: str) -> tuple[int, str]:
    """Reset simulated GPU `device` (index or UUID): (exit code, what nvidia-smi would print)."""
    if gpu_state.state_dir_problem(state_dir) is not None:
        return EXIT_DRIVER_NOT_LOADED, (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running."
        )
    assert state_dir is not None  # state_dir_problem(None) is a problem
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


def print_reset(state_dir: Path | None, device: str) -> int:
    """Run `reset` and print as nvidia-smi does; a missing state dir is also explained on stderr
    (nvidia-smi's message alone would hide a FAKE_GPU_STATE_DIR typo)."""
    code, message = reset(state_dir, device)
    print(message, flush=True)
    problem = gpu_state.state_dir_problem(state_dir)
    if code == EXIT_DRIVER_NOT_LOADED and problem is not None:
        print(f"fake_gpu: {problem}", file=sys.stderr, flush=True)
    return code


def _size(text: str) -> int:
    """argparse type: a byte count, optionally with a unit (143771MiB, 141GiB, 80GB)."""
    found = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or e.g. 143771MiB)")
    return int(found.group(1)) * _UNITS[unit]


def _count(text: str, *, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}: {value}")
    return value


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the state dir (default: $FAKE_GPU_STATE_DIR)",
    )


def _build_create(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("count", metavar="N", type=lambda t: _count(t, least=0))
    _add_dir(parser)
    parser.add_argument("--total-bytes", type=_size, default=gpu_state.DEFAULT_TOTAL_BYTES)
    parser.add_argument("--numa-nodes", type=lambda t: _count(t, least=1), default=1)
    parser.add_argument("--name", default=gpu_state.DEFAULT_NAME)


def _create(args: argparse.Namespace, state_dir: Path) -> int:
    try:
        gpu_state.create_gpus(
            state_dir,
            args.count,
            total_bytes=args.total_bytes,
            numa_nodes=args.numa_nodes,
            name=args.name,
        )
    except OSError as exc:
        print(f"fake_gpu: cannot create {state_dir}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    print(f"created {args.count} simulated GPUs in {state_dir}")
    return _print_list(state_dir, as_json=False)


def _build_reset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("device", metavar="INDEX|UUID")
    _add_dir(parser)


def _reset(args: argparse.Namespace, state_dir: Path) -> int:
    return print_reset(state_dir, args.device)


def _build_list(parser: argparse.ArgumentParser) -> None:
    _add_dir(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")


def _list(args: argparse.Namespace, state_dir: Path) -> int:
    problem = gpu_state.state_dir_problem(state_dir)
    if problem is not None:
        print(f"fake_gpu: {problem}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    return _print_list(state_dir, as_json=args.json)


def describe(state_dir: Path) -> dict[str, Any]:
    """The GPUs and their holders as fake_nvml reports them (the release rules applied)."""
    holdings = gpu_state.read_holdings(state_dir)
    gpus: list[dict[str, Any]] = []
    for gpu in gpu_state.read_gpus(state_dir):
        mine = [h for h in holdings if h.gpu_index == gpu.index]
        used = min(gpu.total_bytes, gpu.baseline_used_bytes + sum(h.used_bytes for h in mine))
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "numa_node": gpu.numa_node,
                "total_bytes": gpu.total_bytes,
                "used_bytes": used,
                "holders": [
                    {"pid": h.pid if h.listed else None, "used_bytes": h.used_bytes} for h in mine
                ],
            }
        )
    return {"gpus": gpus, "nvml_hang_s": gpu_state.nvml_hang_s(state_dir)}


def _print_list(state_dir: Path, *, as_json: bool) -> int:
    described = describe(state_dir)
    if as_json:
        print(json.dumps(described))
        return EXIT_OK
    for gpu in described["gpus"]:
        print(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        print(
            f"    NUMA node {gpu['numa_node']}, {gpu['total_bytes'] // _MiB} MiB total, "
            f"{gpu['used_bytes'] // _MiB} MiB used"
        )
        for holder in gpu["holders"]:
            who = f"pid {holder['pid']}" if holder["pid"] is not None else "no pid"
            note = "" if holder["pid"] is not None else f" (stuck until reset {gpu['index']})"
            print(f"    {who}: {holder['used_bytes'] // _MiB} MiB{note}")
    if described["nvml_hang_s"]:
        print(f"every fake_nvml call hangs {described['nvml_hang_s']} s")
    return EXIT_OK


Handler = Callable[[argparse.Namespace, Path], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {
    "create": ("make a state dir with N idle simulated GPUs", _build_create, _create),
    "reset": ("nvidia-smi --gpu-reset for one simulated GPU", _build_reset, _reset),
    "list": ("the simulated GPUs and the processes holding memory on them", _build_list, _list),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=PROG, description="Simulated GPUs (supervisor.testing).")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, build, _handler) in COMMANDS.items():
        build(commands.add_parser(name, help=help_text, description=help_text))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(sys.argv[1:] if argv is None else argv)  # exits 2 on bad input
    env = os.environ.get("FAKE_GPU_STATE_DIR")
    state_dir = args.dir if args.dir is not None else Path(env) if env else None
    if state_dir is None:
        top.error(f"{args.command}: no state dir: pass --dir DIR or set FAKE_GPU_STATE_DIR")
    return COMMANDS[args.command][2](args, state_dir)


if __name__ == "__main__":
    sys.exit(main())
