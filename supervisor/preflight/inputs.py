"""The pre-flight's inputs: GPU facts, NUMA loads and the checks only this host can answer (port,
GPU holders, memlock, /dev/shm, hugepages). Given facts (`[host]`, command line) win over
measured ones. Reads through the adapters; the arithmetic is core's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.adapters.host import HostProbe, HostReadError, is_port_bound
from supervisor.adapters.model_config import ModelInfo
from supervisor.config import SupervisorConfig
from supervisor.core import fit
from supervisor.core.checks import (
    Check,
    Status,
    check_gpu_holders,
    check_hugepages,
    check_memlock,
    check_shm,
)
from supervisor.core.model_geometry import kv_quant_note
from supervisor.core.numa_binding import Binding, sglang_binding
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.sglang_facts import HUGEPAGE_ENV
from supervisor.core.shm_space import launch_need
from supervisor.core.units import parse_size
from supervisor.errors import ConfigError

if TYPE_CHECKING:  # types only: core.ports brings the run loop's events and classifier
    from supervisor.core.ports import GpuSensor
    from supervisor.core.readings import GpuState


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuFacts:
    """What is known about the target GPUs."""

    total_bytes: int | None  # smallest memory.total over visible GPUs (SGLang's gpu_mem)
    free_bytes: int | None  # smallest free memory over the target GPUs, CUDA context taken off
    states: tuple[GpuState, ...] = ()
    checks: tuple[Check, ...] = ()


def resolve_relative(path: str | None, config_dir: Path | None) -> str | None:
    """A relative path from the config file: as given if it exists, else next to the config."""
    if path is None or Path(path).is_absolute() or Path(path).exists() or config_dir is None:
        return path
    candidate = config_dir / path
    return str(candidate) if candidate.exists() else path


def model_checks(model: ModelInfo, plan: LaunchPlan) -> list[Check]:
    """Where the model's facts come from, and what in its files reads otherwise than it seems:
    a damaged shard header (no tensor list), a KV quantization SGLang ignores."""
    if model.model_dir is None:
        detail = f"model not on this host; geometry from {model.config_file}"
        checks = [Check("model", Status.WARN, detail)]
    else:
        checks = [Check("model", Status.OK, f"config read from {model.config_file}")]
    if model.shard_problem is not None:
        detail = (
            f"{model.shard_problem}: the replicated weights are estimated from config.json; "
            "SGLang cannot load a damaged shard"
        )
        checks.append(Check("weights", Status.WARN, detail))
    note = kv_quant_note(model.config, plan)
    if note is not None:
        checks.append(Check("kv_cache_dtype", Status.WARN, note))
    return checks


def given_gpus(config: SupervisorConfig, plan: LaunchPlan) -> GpuFacts:
    """The GPUs as `[host] gpus` / `gpu_memory` describe them (planning another box)."""
    host = config.host
    needed = max(plan.local_gpu_ids(), default=-1) + 1  # none on --device cpu
    if host.gpus is not None and host.gpus < needed:
        check = Check(
            "gpus", Status.FAIL, f"the plan needs GPUs 0..{needed - 1}, {host.gpus} given"
        )
    else:
        check = Check("gpus", Status.OK, "GPU facts given (not measured)")
    total = host.gpu_memory_bytes
    free = None if total is None else max(0, total - config.preflight.gpu_context_bytes)
    return GpuFacts(total_bytes=total, free_bytes=free, checks=(check,))


def read_gpus(config: SupervisorConfig, plan: LaunchPlan, sensor: GpuSensor | None) -> GpuFacts:
    """GPU facts: given ones when `[host]` names any, else one read of `sensor` (None: none)."""
    if config.host.gpus is not None or config.host.gpu_memory_bytes is not None:
        return given_gpus(config, plan)
    states = sensor.read_gpus() if sensor is not None else None
    if not states:
        warning = Check(
            "gpus",
            Status.WARN,
            f"no GPU could be read (backend {config.gpu.backend}); device pool unknown: give "
            "--gpus and --gpu-memory",
        )
        return GpuFacts(total_bytes=None, free_bytes=None, checks=(warning,))
    by_index = {g.index: g for g in states}
    missing = [i for i in plan.local_gpu_ids() if i not in by_index]
    if missing:
        check = Check(
            "gpus", Status.FAIL, f"the plan needs GPU(s) {missing} but {len(states)} are visible"
        )
    else:
        check = Check("gpus", Status.OK, f"{len(states)} GPU(s) visible")
    targets = [by_index[i] for i in plan.local_gpu_ids() if i in by_index]
    free = min((g.free_bytes for g in targets), default=0)
    return GpuFacts(
        total_bytes=min(g.total_bytes for g in states),
        free_bytes=max(0, free - config.preflight.gpu_context_bytes),
        states=tuple(targets),
        checks=(check,),
    )


def numa_loads(
    config: SupervisorConfig,
    plan: LaunchPlan,
    gpus: GpuFacts,
    probe: HostProbe,
    planning: bool,
    env: Mapping[str, str],
) -> tuple[tuple[fit.NumaLoad, ...], list[Check]]:
    """Free memory and local ranks per NUMA node: given (`[[host.numa]]`), or measured when
    SGLang will bind the ranks' memory to their nodes (core/numa_binding.py); else none."""
    ids = plan.local_gpu_ids()
    if config.host.numa:
        _check_given_numa(config, ids)
        loads = tuple(
            fit.NumaLoad(
                node=spec.node,
                available_bytes=spec.mem_available_bytes,
                ranks=sum(1 for i in ids if i in spec.gpus),
            )
            for spec in config.host.numa
        )
        return loads, []
    if planning:
        return (), []
    try:
        nodes = probe.read_numa_nodes()
    except HostReadError as exc:
        return (), [Check("numa", Status.WARN, f"NUMA layout unreadable, not checked: {exc}")]
    import shutil  # here, not at the top: with bz2 and lzma, only a measured NUMA host needs it

    numactl = shutil.which("numactl", path=env.get("PATH")) is not None
    explicit = plan.numa_node is not None
    binding, why = sglang_binding(
        explicit=explicit, nodes=len(nodes), numactl_on_path=numactl, env=env
    )
    if binding is not Binding.MEMBIND:
        if len(nodes) < 2 and not explicit:
            return (), []
        detail = f"SGLang will not hold ranks to a NUMA node ({why}): per-node fit not checked"
        return (), [Check("numa", Status.OK, detail)]
    gpu_node = _gpu_nodes(plan, gpus)
    if any(gpu_node.get(i) is None for i in ids):
        detail = (
            f"{len(nodes)} NUMA nodes but the GPUs' nodes are unknown: per-node fit not checked"
        )
        return (), [Check("numa", Status.WARN, detail)]
    loads = tuple(
        fit.NumaLoad(
            node=n.node,
            available_bytes=n.available_bytes,
            ranks=sum(1 for i in ids if gpu_node.get(i) == n.node),
        )
        for n in nodes
    )
    detail = f"SGLang binds each rank's memory to its GPU's node ({why}): per-node fit checked"
    return loads, [Check("numa", Status.OK, detail)]


def _check_given_numa(config: SupervisorConfig, ids: tuple[int, ...]) -> None:
    """Every GPU of the launch on a given node: a rank on none would be checked nowhere, and
    the nodes would pass on memory no rank uses.

    Raises:
        ConfigError: GPUs of the launch that no `--numa` / `[[host.numa]]` node lists (named).
    """
    listed = {i for spec in config.host.numa for i in spec.gpus}
    unplaced = [i for i in ids if i not in listed]
    if unplaced:
        where = ", ".join(str(i) for i in sorted(listed)) or "none"
        raise ConfigError(
            f"GPU(s) {', '.join(str(i) for i in unplaced)} of this launch are on no NUMA node "
            f"given (--numa / [[host.numa]] list GPU(s) {where}): give each node its GPUs"
        )


def _gpu_nodes(plan: LaunchPlan, gpus: GpuFacts) -> dict[int, int | None]:
    """The node of each GPU: `--numa-node`, indexed by GPU id, else what NVML reports."""
    if plan.numa_node is not None:
        return {
            i: plan.numa_node[i] if i < len(plan.numa_node) else None for i in plan.local_gpu_ids()
        }
    return {g.index: g.numa_node for g in gpus.states}


def gpu_holders_check(plan: LaunchPlan, gpus: GpuFacts, probe: HostProbe) -> Check:
    """Processes on the target GPUs: NVML's lists and `/dev/nvidiaN` holders."""
    holders: dict[int, list[int | str]] = {}
    for gpu in gpus.states:
        for proc in gpu.processes:
            holders.setdefault(proc.pid, []).append(gpu.index)
    targets = {f"/dev/nvidia{i}" for i in plan.local_gpu_ids()}
    for pid, devices in probe.read_device_holders(exclude_pid=os.getpid()).items():
        hit = sorted(targets & devices)
        if hit and pid not in holders:
            holders[pid] = list(hit)
    return check_gpu_holders(holders, gpus_read=bool(gpus.states))


def hugepages_check(
    probe: HostProbe, env: Mapping[str, str], pools_bytes: int | None
) -> Check | None:
    """Only with SGLANG_HUGEPAGE_SIZE: the pools then come from hugetlb, not MemAvailable."""
    page_env = env.get(HUGEPAGE_ENV)
    if not page_env:
        return None
    try:
        # SGLang spells the sizes 2MB and 1GB and means binary units.
        wanted = parse_size(page_env.upper().replace("MB", "MiB").replace("GB", "GiB"))
    except ValueError:
        return Check("hugepages", Status.FAIL, f"{HUGEPAGE_ENV}={page_env!r}: use 2MB or 1GB")
    free = [h.free_bytes for h in probe.read_hugepages() if h.page_bytes == wanted]
    return check_hugepages(page_env, free[0] if free else None, pools_bytes)


def local_checks(
    plan: LaunchPlan,
    gpus: GpuFacts,
    probe: HostProbe,
    env: Mapping[str, str],
    pools_bytes: int | None,
    *,
    same_user: bool = True,
) -> list[Check]:
    """Checks that only make sense on the box itself (skipped when planning another one).

    `same_user`: the server runs as this process's user, so it inherits its capabilities
    (a switch to [server] user drops them)."""
    checks: list[Check] = []
    if plan.node_rank == 0:
        bound = is_port_bound(plan.host, plan.port)
        checks.append(
            Check("port", Status.FAIL, f"{plan.host}:{plan.port} is already bound")
            if bound
            else Check("port", Status.OK, f"{plan.host}:{plan.port} is free")
        )
    checks.append(gpu_holders_check(plan, gpus, probe))
    try:
        ipc_lock = same_user and probe.has_ipc_lock()
        checks.append(check_memlock(probe.read_memlock_limit(), ipc_lock=ipc_lock))
    except HostReadError:
        checks.append(check_memlock(None, readable=False))
    checks.append(check_shm(probe.read_shm(), launch_need(plan, env)))
    huge = hugepages_check(probe, env, pools_bytes)
    if huge is not None:
        checks.append(huge)
    return checks
