"""Pre-flight shell: gather the plan, model, GPU and host facts, run the core arithmetic, report.

`run_preflight(config, argv)` is what `sglang-supervisor preflight` prints and what `run` calls as
its gate before launching. Given facts (`[host]`, command-line) replace measured ones.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from supervisor.adapters.host import HostProbe, HostReadError, is_port_bound
from supervisor.adapters.model_config import ModelInfo, load_model_config
from supervisor.adapters.sglang_version import installed_sglang_version, interpreter_for
from supervisor.config import SupervisorConfig
from supervisor.core import fit, model_geometry
from supervisor.core.assess import assess_host
from supervisor.core.checks import (
    Check,
    FitReport,
    SglangRules,
    Status,
    check_gpu_holders,
    check_hugepages,
    check_memlock,
    check_shm,
    rules_for_version,
)
from supervisor.core.readings import GpuState
from supervisor.core.sglang_args import ArgvError, LaunchPlan, parse_launch_args, redact_argv
from supervisor.core.sglang_args import with_flag_value as _with_flag_value
from supervisor.core.units import GB, parse_size
from supervisor.errors import ConfigError
from supervisor.ports import GpuSensor


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Gpus:
    """What is known about the target GPUs."""

    total_bytes: int | None  # smallest memory.total over visible GPUs (SGLang's gpu_mem)
    free_bytes: int | None  # smallest free memory over the target GPUs, CUDA context taken off
    states: tuple[GpuState, ...] = ()
    checks: tuple[Check, ...] = ()


def parse_plan(argv: Sequence[str]) -> LaunchPlan:
    """The launch plan, with argv mistakes as ConfigError (exit 2)."""
    try:
        plan = parse_launch_args(argv)
    except ArgvError as exc:
        raise ConfigError(f"launch_server arguments: {exc}") from None
    if not plan.model_path:
        raise ConfigError("launch_server arguments: --model-path is missing")
    return plan


def _resolve_relative(path: str | None, config_dir: Path | None) -> str | None:
    """A relative path from the config file: as given if it exists, else next to the config."""
    if path is None or Path(path).is_absolute() or Path(path).exists() or config_dir is None:
        return path
    candidate = config_dir / path
    return str(candidate) if candidate.exists() else path


def _open_sensor(backend: str) -> GpuSensor:
    # Lazy: NVML (or its simulation) loads only when the GPU facts are not given.
    from supervisor.adapters.nvml import open_gpu_sensor

    return open_gpu_sensor(backend)


def _read_gpus(config: SupervisorConfig, plan: LaunchPlan, sensor: GpuSensor | None) -> _Gpus:
    host = config.host
    context = config.preflight.gpu_context_bytes
    needed = max(plan.local_gpu_ids()) + 1
    if host.gpus is not None or host.gpu_memory_bytes is not None:
        checks: list[Check] = []
        if host.gpus is not None and host.gpus < needed:
            checks.append(
                Check(
                    "gpus", Status.FAIL, f"the plan needs GPUs 0..{needed - 1}, {host.gpus} given"
                )
            )
        else:
            checks.append(Check("gpus", Status.OK, "GPU facts given (not measured)"))
        total = host.gpu_memory_bytes
        free = None if total is None else max(0, total - context)
        return _Gpus(total_bytes=total, free_bytes=free, checks=tuple(checks))
    owned = sensor is None
    if sensor is None and config.gpu.backend != "none":
        sensor = _open_sensor(config.gpu.backend)
    states = None
    if sensor is not None:
        try:
            states = sensor.read_gpus()
        finally:
            if owned:
                sensor.close()
    if not states:
        return _Gpus(
            total_bytes=None,
            free_bytes=None,
            checks=(
                Check(
                    "gpus",
                    Status.WARN,
                    "no GPU could be read (backend "
                    f"{config.gpu.backend}); device pool unknown: give --gpus and --gpu-memory",
                ),
            ),
        )
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
    return _Gpus(
        total_bytes=min(g.total_bytes for g in states),
        free_bytes=max(0, free - context),
        states=tuple(targets),
        checks=(check,),
    )


def _rules(config: SupervisorConfig) -> SglangRules:
    version = config.host.sglang_version
    if version is None:
        version = installed_sglang_version(interpreter_for(config.server.command))
    return rules_for_version(version)


def _numa_loads(
    config: SupervisorConfig, plan: LaunchPlan, gpus: _Gpus, probe: HostProbe, planning: bool
) -> tuple[tuple[fit.NumaLoad, ...], list[Check]]:
    ids = plan.local_gpu_ids()
    checks: list[Check] = []
    if config.host.numa:
        return tuple(
            fit.NumaLoad(
                node=spec.node,
                available_bytes=spec.mem_available_bytes,
                ranks=sum(1 for i in ids if i in spec.gpus),
            )
            for spec in config.host.numa
        ), checks
    if planning:
        return (), checks
    try:
        nodes = probe.read_numa_nodes()
    except HostReadError as exc:
        return (), [Check("numa", Status.WARN, f"NUMA layout unreadable, not checked: {exc}")]
    if len(nodes) < 2:
        return (), checks
    gpu_node = {g.index: g.numa_node for g in gpus.states}
    if any(gpu_node.get(i) is None for i in ids):
        checks.append(
            Check(
                "numa",
                Status.WARN,
                f"{len(nodes)} NUMA nodes but the GPUs' nodes are unknown: per-node fit "
                "not checked",
            )
        )
        return (), checks
    return tuple(
        fit.NumaLoad(
            node=n.node,
            available_bytes=n.available_bytes,
            ranks=sum(1 for i in ids if gpu_node.get(i) == n.node),
        )
        for n in nodes
    ), checks


def _local_checks(
    plan: LaunchPlan, gpus: _Gpus, probe: HostProbe, env: Mapping[str, str], pools_bytes: int | None
) -> list[Check]:
    """Checks that only make sense on the box itself (skipped when planning another one)."""
    checks: list[Check] = []
    if plan.node_rank == 0:
        bound = is_port_bound(plan.host, plan.port)
        checks.append(
            Check("port", Status.FAIL, f"{plan.host}:{plan.port} is already bound")
            if bound
            else Check("port", Status.OK, f"{plan.host}:{plan.port} is free")
        )
    holders: dict[int, list[int | str]] = {}
    for gpu in gpus.states:
        for proc in gpu.processes:
            holders.setdefault(proc.pid, []).append(gpu.index)
    targets = {f"/dev/nvidia{i}" for i in plan.local_gpu_ids()}
    for pid, devices in probe.read_device_holders(exclude_pid=os.getpid()).items():
        hit = sorted(targets & devices)
        if hit and pid not in holders:
            holders[pid] = list(hit)
    checks.append(check_gpu_holders(holders))
    try:
        checks.append(check_memlock(probe.read_memlock_limit()))
    except HostReadError:
        checks.append(check_memlock(None, readable=False))
    checks.append(check_shm(probe.read_shm_bytes()))
    page_env = env.get("SGLANG_HUGEPAGE_SIZE")
    if page_env:
        try:
            # SGLang spells the sizes 2MB and 1GB and means binary units.
            wanted = parse_size(page_env.upper().replace("MB", "MiB").replace("GB", "GiB"))
        except ValueError:
            checks.append(
                Check(
                    "hugepages", Status.FAIL, f"SGLANG_HUGEPAGE_SIZE={page_env!r}: use 2MB or 1GB"
                )
            )
        else:
            free = [h.free_bytes for h in probe.read_hugepages() if h.page_bytes == wanted]
            hp = check_hugepages(page_env, free[0] if free else None, pools_bytes)
            if hp is not None:
                checks.append(hp)
    return checks


def run_preflight(
    config: SupervisorConfig,
    argv: Sequence[str],
    *,
    gpu_sensor: GpuSensor | None = None,
    probe: HostProbe | None = None,
    env: Mapping[str, str] | None = None,
    config_dir: Path | None = None,
) -> FitReport:
    """Decide whether `argv` (launch_server's arguments) fits this host, or the one described.

    Raises:
        ConfigError: bad argv, missing or malformed model config, or an unreadable /proc/meminfo
            with no `mem_available` given (exit 2).
    """
    probe = probe or HostProbe()
    env = dict(os.environ if env is None else env) | dict(config.server.env)
    plan = parse_plan(argv)
    override = _resolve_relative(config.server.model_config, config_dir)
    model = load_model_config(plan.model_path or "", override)
    try:
        bpt = model_geometry.bytes_per_token_per_rank(model.config, plan)
        idx = model_geometry.indexer_bytes_per_token_per_rank(model.config, plan)
        layers = model_geometry.layers_per_rank(model.config, plan)
        kv_dtype = model_geometry.kv_cache_dtype(model.config, plan)
    except model_geometry.GeometryError as exc:
        raise ConfigError(f"model config {model.config_file}: {exc}") from None
    checks: list[Check] = [_model_check(model)]
    pre = config.preflight
    given_available = config.host.mem_available_bytes
    planning = given_available is not None
    gpus = _read_gpus(config, plan, gpu_sensor)
    checks.extend(gpus.checks)
    rules = _rules(config)

    # Device pool per rank: (F·m − W) / cell (sglang.md §1.5).
    mla = model_geometry.is_mla(model.config)
    mem_fraction = plan.mem_fraction_static
    if mem_fraction is None and gpus.total_bytes is not None:
        mem_fraction = fit.auto_mem_fraction_static(gpus.total_bytes, plan, mla=mla)
    weights = pre.weights_bytes if pre.weights_bytes is not None else model.weights_bytes
    weights_per_rank = None
    if weights is not None:
        weights_per_rank = max(
            0, weights // (plan.tp_size * plan.pp_size) - plan.cpu_offload_gb * GB
        )
    device_tokens = None
    if gpus.free_bytes is not None and mem_fraction is not None and weights_per_rank is not None:
        device_tokens = fit.estimate_device_tokens(
            gpu_free_bytes=gpus.free_bytes,
            weights_per_rank_bytes=weights_per_rank,
            mem_fraction_static=mem_fraction,
            bytes_per_token=bpt,
            page_size=plan.effective_page_size,
            max_total_tokens=plan.max_total_tokens,
        )
        checks.append(
            Check("device_kv", Status.FAIL, "loaded weights leave no GPU memory for the KV cache")
            if device_tokens == 0
            else Check("device_kv", Status.OK, f"{device_tokens:,} KV tokens per rank on the GPU")
        )
    elif gpus.free_bytes is not None and weights_per_rank is None:
        checks.append(
            Check(
                "device_kv",
                Status.WARN,
                "weights size unknown (no *.safetensors here): set [preflight] weights",
            )
        )

    # Host memory (sglang.md §1.6 budget, §5 overheads).
    if given_available is not None:
        available = given_available
        cgroup = config.host.cgroup_headroom_bytes
        checks.append(Check("host_facts", Status.OK, "host facts given (planning mode)"))
    else:
        try:
            available = probe.read_meminfo().available_bytes
        except HostReadError as exc:
            raise ConfigError(f"{exc}; give --mem-available to plan without it") from None
        cgroup = config.host.cgroup_headroom_bytes
        if cgroup is None:
            reading = probe.read_cgroup_headroom()
            cgroup = reading.headroom_bytes
            if reading.warning:
                checks.append(Check("cgroup", Status.WARN, reading.warning))
    usable = available if cgroup is None else min(available, cgroup)
    local_ranks = plan.local_ranks
    load_transient = 0
    if plan.weight_loader_disable_mmap:
        shard = model.largest_shard_bytes or pre.shard_bytes
        load_transient = (pre.load_threads + 2) * shard * local_ranks
    budget = fit.HostBudget(
        usable_bytes=usable,
        reserve_bytes=pre.reserve_bytes,
        per_rank_overhead_bytes=pre.per_rank_overhead_bytes,
        main_overhead_bytes=pre.main_overhead_bytes,
        load_transient_bytes=load_transient,
        cpu_offload_bytes_per_rank=plan.cpu_offload_gb * GB,
    )
    numa, numa_checks = _numa_loads(config, plan, gpus, probe, planning)
    checks.extend(numa_checks)

    host = assess_host(
        plan=plan,
        bytes_per_token=bpt,
        indexer_bytes_per_token=idx,
        device_tokens=device_tokens,
        budget=budget,
        numa=numa,
        rules=rules,
        cgroup_limited=cgroup is not None,
    )
    checks.extend(host.checks)
    pool_bytes = host.pool_bytes
    if not planning:
        checks.extend(
            _local_checks(
                plan, gpus, probe, env, None if pool_bytes is None else pool_bytes * local_ranks
            )
        )

    safe = host.max_hicache_size_gb
    safe_tokens = host.safe_host_tokens
    return FitReport(
        model=plan.model_path or model.path,
        attention=model_geometry.attention_kind(model.config),
        kv_cache_dtype=kv_dtype,
        layers_per_rank=layers,
        local_ranks=local_ranks,
        bytes_per_token_per_rank=bpt,
        indexer_bytes_per_token_per_rank=idx,
        weights_per_rank_bytes=weights_per_rank,
        gpu_memory_bytes=gpus.total_bytes,
        gpu_free_bytes=gpus.free_bytes,
        mem_fraction_static=mem_fraction,
        device_tokens_per_rank=device_tokens,
        hicache_mode=host.mode,
        hicache_ratio=host.ratio,
        host_pool_tokens_per_rank=host.pool_tokens,
        host_pool_bytes_per_rank=pool_bytes,
        host_required_bytes=host.required_bytes,
        host_budget_bytes=budget.budget_bytes,
        terms=host.terms,
        max_hicache_size_gb=safe,
        equivalent_ratio=(safe_tokens / device_tokens) if safe and device_tokens else None,
        safe_host_tokens_per_rank=safe_tokens,
        avg_request_tokens=pre.avg_request_tokens,
        sglang_version=rules.version,
        checks=tuple(checks),
        suggested_argv=suggested_argv(argv, safe),
        numa=tuple(
            {"node": n.node, "ranks": n.ranks, "available_bytes": n.available_bytes} for n in numa
        ),
    )


def suggested_argv(argv: Sequence[str], safe_size_gb: int) -> tuple[str, ...] | None:
    """The user's argv with the safe `--hicache-size` substituted, secrets redacted."""
    if safe_size_gb <= 0:
        return None
    return redact_argv(_with_flag_value(argv, "--hicache-size", str(safe_size_gb)))


def _model_check(model: ModelInfo) -> Check:
    if model.model_dir is None:
        return Check(
            "model",
            Status.WARN,
            f"model not on this host; geometry from {model.config_file}",
        )
    return Check("model", Status.OK, f"config read from {model.config_file}")
