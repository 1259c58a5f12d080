"""Simulated GPUs: the FAKE_GPU_STATE_DIR format, its writers (ranks, orphans, reset) and reader.

Layout (every file JSON, written atomically: temp file + fsync + os.replace, so concurrent
processes never see half a file; each holder owns its own file, so writers never contend):

    gpus.json                     {"gpus": [{"index", "uuid", "name", "total_bytes",
                                   "numa_node", "baseline_used_bytes", "nvlink_group",
                                   "per_gpu_reset", "nvswitch"}, ...]}
    holders/gpu<I>-pid<P>.json    {"gpu_index", "pid", "start_ticks", "used_bytes",
                                   "release_delay_s", "stuck", "dead_since"}
    nvml.json                     {"hang_s": S}   optional: every fake_nvml call blocks S seconds
    health/gpu<I>.json            a GPU's faults (gpu_faults.py); absent: healthy
    events.jsonl                  the driver's event queue (gpu_events.py)

A holder is live while /proc/P exists, is not a zombie and has the recorded start time (so a
recycled PID never counts). Once a reader sees it dead it stamps `dead_since` (wall clock); the
memory stays used and the PID stays listed for `release_delay_s` (a real rank unpinning in D
state), then the file is deleted, unless `stuck`: then the memory stays used, with no PID listed
(driver-held), until `python -m supervisor.testing.fake_gpu reset INDEX` clears it.

NVLink: GPUs with the same `nvlink_group` are NVLink peers (fake_nvml reports the links and P2P
over NVLink between them). Without `per_gpu_reset` a reset must name the whole group at once, as
nvidia-smi demands on NVSwitch boxes without Fabric Manager (and before Ampere). `nvswitch`: the
GPU sits on an NVSwitch fabric, whose state fake_nvml reports (NOT_SUPPORTED otherwise).

Made with `python -m supervisor.testing.fake_gpu create N --dir DIR` (or `create_gpus`); a
directory without gpus.json is refused by every reader with `state_dir_problem`'s message.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.atomic_file import write_text_atomic

GPUS_FILE = "gpus.json"
HOLDERS_DIR = "holders"
NVML_FILE = "nvml.json"
HEALTH_DIR = "health"
EVENTS_FILE = "events.jsonl"
# H200: 143771 MiB as NVML reports it; baseline ≈ what a driver holds when idle.
DEFAULT_TOTAL_BYTES = 143771 * 1024 * 1024
DEFAULT_BASELINE_USED_BYTES = 512 * 1024 * 1024
DEFAULT_NAME = "NVIDIA H200"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimGpu:
    index: int
    uuid: str
    name: str
    total_bytes: int
    numa_node: int
    baseline_used_bytes: int
    nvlink_group: int | None = None  # GPUs sharing a group are NVLink peers
    per_gpu_reset: bool = True  # False: a reset must take the whole NVLink group at once
    nvswitch: bool = False  # on an NVSwitch fabric (fabric state reported)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimHolding:
    gpu_index: int
    pid: int
    used_bytes: int
    listed: bool  # False once only the memory is left (stuck, driver-held)


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON via a temp file in the same directory, fsync, os.replace."""
    write_text_atomic(path, json.dumps(data))


def _read_json(path: Path) -> Any:
    with path.open() as f:
        return json.load(f)


def gpu_uuid(index: int) -> str:
    """A stable, well-formed UUID for simulated GPU `index` (NVML spells them GPU-xxxxxxxx-…)."""
    return f"GPU-5a4e0000-0000-4000-8000-{index:012x}"


def create_gpus(
    state_dir: Path,
    count: int,
    *,
    total_bytes: int = DEFAULT_TOTAL_BYTES,
    numa_nodes: int = 1,
    baseline_used_bytes: int = DEFAULT_BASELINE_USED_BYTES,
    name: str = DEFAULT_NAME,
    nvlink_peers: int = 0,
    per_gpu_reset: bool = True,
    nvswitch: bool = False,
) -> tuple[SimGpu, ...]:
    """Create (or replace) a state dir with `count` idle, healthy GPUs spread evenly over
    `numa_nodes`; with `nvlink_peers` K > 1, GPUs 0..K-1, K..2K-1, ... are NVLink peer groups."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / HOLDERS_DIR).mkdir(exist_ok=True)
    for stale in (state_dir / HEALTH_DIR).glob("*.json"):
        stale.unlink(missing_ok=True)  # replaced GPUs are healthy and have no event history
    (state_dir / EVENTS_FILE).unlink(missing_ok=True)
    per_node = max(1, -(-count // max(1, numa_nodes)))
    gpus = tuple(
        SimGpu(
            index=i,
            uuid=gpu_uuid(i),
            name=name,
            total_bytes=total_bytes,
            numa_node=i // per_node,
            baseline_used_bytes=baseline_used_bytes,
            nvlink_group=i // nvlink_peers if nvlink_peers > 1 else None,
            per_gpu_reset=per_gpu_reset,
            nvswitch=nvswitch,
        )
        for i in range(count)
    )
    write_json_atomic(
        state_dir / GPUS_FILE,
        {"gpus": [{f: getattr(g, f) for f in SimGpu.__dataclass_fields__} for g in gpus]},
    )
    return gpus


def pci_bus_id(index: int) -> str:
    """Simulated GPU `index`'s PCI bus id, as NVML and nvidia-smi spell it (00000000:18:00.0)."""
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"


def create_command(state_dir: Path | str, count: int = 8) -> str:
    """The command that makes simulated GPUs in `state_dir` (quoted in every "no GPUs" message)."""
    return f"python -m supervisor.testing.fake_gpu create {count} --dir {state_dir}"


def state_dir_problem(state_dir: Path | None) -> str | None:
    """What is wrong with `state_dir` as a simulated-GPU state dir, or None when gpus.json reads.

    The message names the directory and says how to create simulated GPUs, so that a typo in
    FAKE_GPU_STATE_DIR reads as one and not as a traceback.
    """
    if state_dir is None:
        return (
            "FAKE_GPU_STATE_DIR is not set; create simulated GPUs with "
            f"`{create_command('DIR')}` and set FAKE_GPU_STATE_DIR=DIR"
        )
    if not state_dir.is_dir():
        what = "does not exist" if not state_dir.exists() else "is not a directory"
    elif not (state_dir / GPUS_FILE).is_file():
        what = f"holds no {GPUS_FILE}"
    else:
        try:
            read_gpus(state_dir)
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            what = f"has an unreadable {GPUS_FILE} ({type(exc).__name__}: {exc})"
    return (
        f"simulated GPU state dir {state_dir} {what}; create simulated GPUs with "
        f"`{create_command(state_dir)}`"
    )


def read_gpus(state_dir: Path) -> tuple[SimGpu, ...]:
    """The GPUs described in `state_dir`/gpus.json (FileNotFoundError: not a state dir)."""
    raw = _read_json(state_dir / GPUS_FILE)
    return tuple(SimGpu(**g) for g in raw["gpus"])


def nvlink_peers(gpus: Iterable[SimGpu], gpu: SimGpu) -> tuple[SimGpu, ...]:
    """The other GPUs of `gpu`'s NVLink group (none without NVLink)."""
    if gpu.nvlink_group is None:
        return ()
    return tuple(g for g in gpus if g.nvlink_group == gpu.nvlink_group and g.index != gpu.index)


def peer_set(state_dir: Path, gpu_index: int) -> tuple[int, ...]:
    """The indices a reset of `gpu_index` must name together: the GPU alone, or its whole NVLink
    group when the GPUs cannot be reset one by one."""
    gpus = read_gpus(state_dir)
    gpu = next(g for g in gpus if g.index == gpu_index)
    if gpu.per_gpu_reset:
        return (gpu.index,)
    return tuple(sorted((gpu.index, *(p.index for p in nvlink_peers(gpus, gpu)))))


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks (/proc/PID/stat field 22), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[19])


def _process_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def is_holder_alive(pid: int, start_ticks: int | None) -> bool:
    """A holder is alive while its PID exists, is not a zombie and is the same process."""
    state = _process_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return start_ticks is None or process_start_ticks(pid) == start_ticks


def _holder_path(state_dir: Path, gpu_index: int, pid: int) -> Path:
    return state_dir / HOLDERS_DIR / f"gpu{gpu_index}-pid{pid}.json"


def register_holder(
    state_dir: Path,
    gpu_index: int,
    used_bytes: int,
    *,
    pid: int | None = None,
    release_delay_s: float = 0.0,
    stuck: bool = False,
) -> Path:
    """Record that `pid` (default: this process) holds `used_bytes` on GPU `gpu_index`."""
    pid = os.getpid() if pid is None else pid
    path = _holder_path(state_dir, gpu_index, pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        path,
        {
            "gpu_index": gpu_index,
            "pid": pid,
            "start_ticks": process_start_ticks(pid),
            "used_bytes": used_bytes,
            "release_delay_s": release_delay_s,
            "stuck": stuck,
            "dead_since": None,
        },
    )
    return path


def _holder_files(state_dir: Path) -> Iterable[Path]:
    holders = state_dir / HOLDERS_DIR
    if not holders.is_dir():
        return ()
    return sorted(p for p in holders.iterdir() if p.suffix == ".json" and p.name[0] != ".")


def read_holdings(state_dir: Path, *, now: float | None = None) -> tuple[SimHolding, ...]:
    """Current holdings, applying the release rules (and updating the files as it goes)."""
    now = time.time() if now is None else now
    out: list[SimHolding] = []
    for path in _holder_files(state_dir):
        try:
            holder = _read_json(path)
        except (OSError, ValueError):
            continue  # deleted meanwhile by a concurrent reader or a reset
        pid = int(holder["pid"])
        if is_holder_alive(pid, holder.get("start_ticks")):
            out.append(
                SimHolding(
                    gpu_index=holder["gpu_index"],
                    pid=pid,
                    used_bytes=holder["used_bytes"],
                    listed=True,
                )
            )
            continue
        dead_since = holder.get("dead_since")
        if dead_since is None:
            holder["dead_since"] = dead_since = now
            try:
                write_json_atomic(path, holder)
            except OSError:
                continue
        released = now - float(dead_since) >= float(holder.get("release_delay_s", 0.0))
        if released and not holder.get("stuck"):
            path.unlink(missing_ok=True)
            continue
        out.append(
            SimHolding(
                gpu_index=holder["gpu_index"],
                pid=pid,
                used_bytes=holder["used_bytes"],
                listed=not released,
            )
        )
    return tuple(out)


def live_holders(state_dir: Path, gpu_index: int) -> tuple[int, ...]:
    """PIDs of live processes holding memory on `gpu_index` (what blocks a reset)."""
    pids: list[int] = []
    for path in _holder_files(state_dir):
        try:
            holder = _read_json(path)
        except (OSError, ValueError):
            continue
        if holder["gpu_index"] == gpu_index and is_holder_alive(
            int(holder["pid"]), holder.get("start_ticks")
        ):
            pids.append(int(holder["pid"]))
    return tuple(pids)


def clear_gpu(state_dir: Path, gpu_index: int) -> int:
    """Drop every holding on `gpu_index` (the reset itself); returns how many were dropped."""
    dropped = 0
    for path in _holder_files(state_dir):
        if path.name.startswith(f"gpu{gpu_index}-"):
            path.unlink(missing_ok=True)
            dropped += 1
    return dropped


def set_nvml_hang(state_dir: Path, hang_s: float | None) -> None:
    """Make every fake_nvml call block `hang_s` seconds (None: stop hanging)."""
    path = state_dir / NVML_FILE
    if hang_s is None:
        path.unlink(missing_ok=True)
    else:
        write_json_atomic(path, {"hang_s": hang_s})


def nvml_hang_s(state_dir: Path) -> float:
    """Seconds each fake_nvml call should block (0 when no hang is set)."""
    try:
        return float(_read_json(state_dir / NVML_FILE).get("hang_s", 0.0))
    except (OSError, ValueError):
        return 0.0
