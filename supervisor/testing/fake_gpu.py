"""Simulated GPUs from the command line: `python -m supervisor.testing.fake_gpu COMMAND ...`.

    create N [--dir DIR] [--total-bytes SIZE] [--numa-nodes K] [--name NAME]
             [--nvlink-peers K] [--reset-peers-together] [--nvswitch]
        make (or replace) a state dir with N idle, healthy GPUs spread evenly over K NUMA nodes
        (SIZE in bytes, or with a unit: 143771MiB, 141GiB); GPUs 0..K-1, K..2K-1, ... NVLink
        peers, which a reset must then name together with --reset-peers-together; then print
        them as `list` does
    reset INDEX|UUID[,...] [INDEX|UUID ...] [--dir DIR]
        `nvidia-smi --gpu-reset -i ID[,...]` (supervisor/testing/fake_gpu_reset.py): frees the
        memory still held, repairs what a reset repairs; refused while a live process uses one
        of them, for a lost GPU, or without every NVLink peer that must come along. Exit codes
        as nvidia-smi: 0 reset, 6 no such GPU, 9 no driver (DIR holds no gpus.json), 15 lost,
        255 in use or peers missing
    list [--dir DIR] [--json]
        every GPU (index, UUID, name, NUMA node, total and used memory, NVLink group, faults)
        and its holders: a PID while it is listed, "no pid" for memory stuck until a reset
    inject FAULT [VALUE] [GPU] [--gpu INDEX] [--dir DIR]
        make a GPU sick (gpu_faults.FAULTS; `inject --help` lists them): xid 79 --gpu 2,
        remap-pending 1, unsupported nvmlDeviceGetRemappedRows 1, clear 1, ...

DIR defaults to $FAKE_GPU_STATE_DIR. Bad input (an unknown command or fault, no DIR at all, a
count that is not an integer, a bad size, a fault's missing value, no such GPU) exits 2 with a
message, never a traceback. `python -m supervisor.testing.fake_gpu_reset ID` stays as an alias
of `reset`. Each command is a (parser builder, handler) pair in COMMANDS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from supervisor.testing import gpu_faults, gpu_state
from supervisor.testing.fake_gpu_reset import (
    EXIT_BAD_ARGUMENT,
    EXIT_DRIVER_NOT_LOADED,
    EXIT_GPU_LOST,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_OTHER,
    print_reset,
    reset,
)

__all__ = [
    "EXIT_BAD_ARGUMENT",
    "EXIT_DRIVER_NOT_LOADED",
    "EXIT_GPU_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_OTHER",
    "describe",
    "main",
    "parser",
    "print_reset",
    "reset",
]

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
_HELP_WIDTH = 100


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
    parser.add_argument(
        "--nvlink-peers",
        metavar="K",
        type=lambda t: _count(t, least=0),
        default=0,
        help="GPUs 0..K-1, K..2K-1, ... are NVLink peer groups (default: no NVLink)",
    )
    parser.add_argument(
        "--reset-peers-together",
        action="store_true",
        help="NVLink peers cannot be reset one by one: a reset must name the whole group",
    )
    parser.add_argument(
        "--nvswitch", action="store_true", help="on an NVSwitch fabric (its state is reported)"
    )


def _create(args: argparse.Namespace, state_dir: Path) -> int:
    try:
        gpu_state.create_gpus(
            state_dir,
            args.count,
            total_bytes=args.total_bytes,
            numa_nodes=args.numa_nodes,
            name=args.name,
            nvlink_peers=args.nvlink_peers,
            per_gpu_reset=not args.reset_peers_together,
            nvswitch=args.nvswitch,
        )
    except OSError as exc:
        print(f"fake_gpu: cannot create {state_dir}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    print(f"created {args.count} simulated GPUs in {state_dir}")
    return _print_list(state_dir, as_json=False)


def _build_reset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("devices", metavar="INDEX|UUID", nargs="+", help="one or more, or a,b,c")
    _add_dir(parser)


def _reset(args: argparse.Namespace, state_dir: Path) -> int:
    return print_reset(state_dir, args.devices)


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
                "nvlink_group": gpu.nvlink_group,
                "per_gpu_reset": gpu.per_gpu_reset,
                "faults": gpu_faults.read_health(state_dir, gpu.index).faults(),
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
        if gpu["nvlink_group"] is not None:
            alone = "" if gpu["per_gpu_reset"] else " (reset together)"
            print(f"    NVLink group {gpu['nvlink_group']}{alone}")
        if gpu["faults"]:
            print(f"    faults: {', '.join(gpu['faults'])}")
    if described["nvml_hang_s"]:
        print(f"every fake_nvml call hangs {described['nvml_hang_s']} s")
    return EXIT_OK


def _build_inject(parser: argparse.ArgumentParser) -> None:
    usages = {name: f"{name} {fault.metavar or ''}" for name, fault in gpu_faults.FAULTS.items()}
    width = max(map(len, usages.values()))
    faults = "\n".join(
        textwrap.fill(
            fault.help,
            width=_HELP_WIDTH,
            initial_indent=f"  {usages[name]:<{width}}  ",
            subsequent_indent=" " * (width + 4),
        )
        for name, fault in gpu_faults.FAULTS.items()
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        textwrap.fill(
            "Make a simulated GPU sick, as fake_nvml then reports it (each fault queues at most "
            "one driver event; a reset repairs what a reset repairs).",
            width=_HELP_WIDTH,
        )
        + "\n\nfaults:\n"
        + faults
    )
    parser.epilog = "e.g. inject xid 79 --gpu 2; inject remap-pending 1; inject clear 1"
    parser.add_argument("fault", metavar="FAULT", choices=gpu_faults.FAULTS)
    parser.add_argument("rest", metavar="[VALUE] [GPU]", nargs="*", help="as the fault takes")
    parser.add_argument("--gpu", metavar="INDEX", type=lambda t: _count(t, least=0))
    _add_dir(parser)


def _inject_target(args: argparse.Namespace) -> tuple[str | None, int]:
    """(the fault's value, the GPU index) from `FAULT [VALUE] [GPU] [--gpu INDEX]`."""
    takes = 1 if gpu_faults.FAULTS[args.fault].metavar else 0
    values, gpus = args.rest[:takes], args.rest[takes:]
    if len(values) < takes:
        raise gpu_faults.FaultError(f"{args.fault}: takes {gpu_faults.FAULTS[args.fault].metavar}")
    if len(gpus) + (args.gpu is not None) != 1:
        raise gpu_faults.FaultError(f"{args.fault}: name one GPU (INDEX, or --gpu INDEX)")
    gpu = args.gpu if args.gpu is not None else gpus[0]
    try:
        return (values[0] if values else None), _count(str(gpu), least=0)
    except argparse.ArgumentTypeError as exc:
        raise gpu_faults.FaultError(f"{args.fault}: GPU {exc}") from None


def _inject(args: argparse.Namespace, state_dir: Path) -> int:
    problem = gpu_state.state_dir_problem(state_dir)
    try:
        if problem is not None:
            raise gpu_faults.FaultError(problem)
        value, gpu = _inject_target(args)
        health = gpu_faults.inject(state_dir, gpu, args.fault, value)
    except gpu_faults.FaultError as exc:
        print(f"{PROG} inject: error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENT
    print(f"GPU {gpu}: {', '.join(health.faults()) or 'healthy'}")
    return EXIT_OK


Handler = Callable[[argparse.Namespace, Path], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {
    "create": ("make a state dir with N idle simulated GPUs", _build_create, _create),
    "reset": ("nvidia-smi --gpu-reset for simulated GPUs", _build_reset, _reset),
    "list": ("the simulated GPUs and the processes holding memory on them", _build_list, _list),
    "inject": ("make a simulated GPU sick (FAULT list: inject --help)", _build_inject, _inject),
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
