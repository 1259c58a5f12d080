"""The pre-flight: does this launch fit the host (or the one described)? Reads the plan, model,
GPU and host facts, runs core's arithmetic, returns the FitReport.

`run_preflight(config, argv, gpu_sensor=...)` is what `sglang-supervisor preflight` prints and
what `run` calls as its gate before every launch with a new argv; the report then travels with
the launch (the watchdog's budget, restart-smaller) so nothing is computed twice.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.adapters.host import HostProbe, HostReadError
from supervisor.config import SupervisorConfig
from supervisor.core import fit, model_geometry
from supervisor.core.assess import HostAssessment, assess_host
from supervisor.core.checks import Check, FitReport, Status
from supervisor.core.measured import Deployment, latest_for
from supervisor.core.sglang_args import LaunchPlan, redact_argv
from supervisor.core.sglang_args import with_flag_value as _with_flag_value
from supervisor.core.sglang_launch import LaunchReader
from supervisor.core.sglang_versions import SglangRules
from supervisor.core.units import format_gb
from supervisor.errors import ConfigError
from supervisor.preflight.consumers import HostConsumers, ModelFacts, host_consumers
from supervisor.preflight.device import Device, DeviceInputs, device_pool
from supervisor.preflight.inputs import (
    GpuFacts,
    local_checks,
    model_checks,
    numa_loads,
    read_gpus,
)
from supervisor.preflight.measurements import load_records
from supervisor.preflight.model import Model, read_model, report_pools, split_checks
from supervisor.preflight.reader import launch_reader, read_plan

if TYPE_CHECKING:  # types only: core.ports brings the run loop's events and classifier
    from supervisor.core.ledger import Reservation
    from supervisor.core.ports import GpuSensor
    from supervisor.preflight.health import HealthGate


def deployment_of(plan: LaunchPlan, gpus: GpuFacts, rules: SglangRules) -> Deployment:
    """What a measurement of this launch is filed under (core/measured.py)."""
    return Deployment(
        model=plan.model_path or "",
        tp_size=plan.tp_size,
        pp_size=plan.pp_size,
        gpu_name=gpus.states[0].name if gpus.states else "",
        gpu_total_bytes=gpus.total_bytes,
        sglang_version=rules.version or rules.table_version,
    )


def _usable(config: SupervisorConfig, probe: HostProbe) -> tuple[int, int | None, list[Check]]:
    """(MemAvailable, cgroup headroom or None, checks): given in planning mode, else read."""
    host = config.host
    if host.mem_available_bytes is not None:
        checks = [Check("host_facts", Status.OK, "host facts given (planning mode)")]
        return host.mem_available_bytes, host.cgroup_headroom_bytes, checks
    try:
        available = probe.read_meminfo().available_bytes
    except HostReadError as exc:
        raise ConfigError(f"{exc}; give --mem-available to plan without it") from None
    if host.cgroup_headroom_bytes is not None:
        return available, host.cgroup_headroom_bytes, []
    reading = probe.read_cgroup_headroom()
    checks = [Check("cgroup", Status.WARN, reading.warning)] if reading.warning else []
    return available, reading.headroom_bytes, checks


def _ledger_checks(claims: Sequence[Reservation]) -> list[Check]:
    if not claims:
        return []
    names = ", ".join(sorted({r.instance for r in claims}))
    total = sum(r.outstanding_bytes for r in claims)
    detail = (
        f"{format_gb(total)} planned and not yet pinned by other instances starting on this "
        f"host ({names}): counted as used"
    )
    return [Check("ledger", Status.OK, detail)]


def _host_budget(
    config: SupervisorConfig,
    plan: LaunchPlan,
    model: Model,
    device: Device,
    probe: HostProbe,
    env: Mapping[str, str],
    reserved: Sequence[Reservation],
) -> tuple[fit.HostBudget, int | None, list[Check]]:
    """The budget, the cgroup headroom (None: no limit) and the checks of both: what is usable,
    less the reserve, the overheads, SGLang's opt-in consumers and other instances' claims."""
    available, cgroup, checks = _usable(config, probe)
    usable = available if cgroup is None else min(available, cgroup)
    facts = ModelFacts(
        config=model.info.config,
        tensor_bytes=model.info.tensor_bytes,
        bytes_per_token=model.bytes_per_token,
        indexer_bytes_per_token=model.indexer_bytes_per_token,
        weights_per_rank_bytes=device.weights_per_rank_bytes,
        device_tokens=device.tokens,
        layout=model.layout,
    )
    consumers = host_consumers(
        plan,
        facts,
        env,
        probe=probe,
        planning=config.host.mem_available_bytes is not None,
        main_overhead_bytes=config.preflight.main_overhead_bytes,
    )
    claims = sum(r.outstanding_bytes for r in reserved)
    budget = _budget(config, plan, model, usable, claims, consumers)
    return budget, cgroup, [*checks, *consumers.checks]


def _budget(
    config: SupervisorConfig,
    plan: LaunchPlan,
    model: Model,
    usable_bytes: int,
    reserved_bytes: int,
    consumers: HostConsumers,
) -> fit.HostBudget:
    pre = config.preflight
    load_transient = 0
    if plan.weight_loader_disable_mmap:
        shard = model.info.largest_shard_bytes or pre.shard_bytes
        load_transient = (pre.load_threads + 2) * shard * plan.local_ranks
    return fit.HostBudget(
        usable_bytes=usable_bytes,
        reserve_bytes=pre.reserve_bytes,
        per_rank_overhead_bytes=pre.per_rank_overhead_bytes,
        main_overhead_bytes=pre.main_overhead_bytes,
        load_transient_bytes=load_transient,
        cpu_offload_bytes_per_rank=consumers.cpu_offload_bytes_per_rank,
        reserved_bytes=reserved_bytes,
        consumers=consumers.counted,
    )


def run_preflight(
    config: SupervisorConfig,
    argv: Sequence[str],
    *,
    gpu_sensor: GpuSensor | None = None,
    probe: HostProbe | None = None,
    env: Mapping[str, str] | None = None,
    config_dir: Path | None = None,
    reader: LaunchReader | None = None,
    state_dir: Path | None = None,
    reserved: Sequence[Reservation] = (),
    health: HealthGate | None = None,
) -> FitReport:
    """Decide whether `argv` (launch_server's arguments) fits this host, or the one described.

    `gpu_sensor` is read once unless `[host]` gives the GPU facts; None: no GPU is read.
    `reader` reads the argv (the run loop passes its own); None: resolved here. `state_dir` holds
    the measurements of earlier launches (default: the config's `[run]` state directory).
    `reserved`: other instances starting on this host (the ledger); what they planned and have
    not pinned yet comes off the budget. `health`: the GPU health gate `run` read (None: here).

    Raises:
        ConfigError: bad argv or SGLang `--config` file, missing or malformed model config, an
            unknown `--sglang-version`, or an unreadable /proc/meminfo with no `mem_available`
            given (exit 2).
    """
    probe = probe or HostProbe()
    env = dict(os.environ if env is None else env) | dict(config.server.env)
    reader = reader or launch_reader(config, argv)
    plan = read_plan(reader, argv)
    model = read_model(config, plan, config_dir, env)
    planning = config.host.mem_available_bytes is not None
    gpus = read_gpus(config, plan, gpu_sensor)
    state = state_dir or config.run.state_path
    device, deployment, device_checks = _device(config, plan, model, gpus, reader.rules, env, state)
    budget, cgroup, host_checks = _host_budget(config, plan, model, device, probe, env, reserved)
    numa, numa_checks = numa_loads(config, plan, gpus, probe, planning, env)
    rules = reader.rules
    host = _assess(plan, model, device, budget, numa, rules, cgroup_limited=cgroup is not None)
    notes = [Check("sglang_args", Status.WARN, note) for note in reader.notes(plan)]
    checks = [*notes, *model_checks(model.info, plan), *split_checks(model, plan), *gpus.checks]
    checks += _health_checks(config, plan, gpus, gpu_sensor, health)
    checks += [*device_checks, *host_checks, *numa_checks, *_ledger_checks(reserved), *host.checks]
    if not planning:
        pools = None if host.pool_bytes is None else host.pool_bytes * plan.local_ranks
        same_user = not (config.server.user or config.server.group)  # else capabilities drop
        checks.extend(local_checks(plan, gpus, probe, env, pools, same_user=same_user))
    report = _report(argv, plan, model, gpus, device, host, budget, numa, rules, config, checks)
    return dataclasses.replace(report, deployment=deployment)


def _assess(
    plan: LaunchPlan,
    model: Model,
    device: Device,
    budget: fit.HostBudget,
    numa: Sequence[fit.NumaLoad],
    rules: SglangRules,
    *,
    cgroup_limited: bool,
) -> HostAssessment:
    """The host side: the host pools beside the device pools, and the budget."""
    return assess_host(
        plan=plan,
        bytes_per_token=model.bytes_per_token,
        indexer_bytes_per_token=model.indexer_bytes_per_token,
        device_tokens=device.tokens,
        budget=budget,
        numa=numa,
        rules=rules,
        cgroup_limited=cgroup_limited,
        layout=model.layout,
        device_pools=device.pools,
    )


def _health_checks(
    config: SupervisorConfig,
    plan: LaunchPlan,
    gpus: GpuFacts,
    sensor: GpuSensor | None,
    health: HealthGate | None,
) -> tuple[Check, ...]:
    """The GPU health gate's checks: as given, else read (when GPUs were: not planning)."""
    if health is None:
        if not gpus.states:
            return ()  # nothing read, nothing judged (planning another box, or no GPU backend)
        from supervisor.preflight.health import read_health_gate  # only with GPUs to judge

        health = read_health_gate(config.gpu, plan.local_gpu_ids(), sensor)
    return health.checks


def _device(
    config: SupervisorConfig,
    plan: LaunchPlan,
    model: Model,
    gpus: GpuFacts,
    rules: SglangRules,
    env: Mapping[str, str],
    state_dir: Path,
) -> tuple[Device, Deployment, list[Check]]:
    """The device pool, from this deployment's last measurement when the state dir has one."""
    deployment = deployment_of(plan, gpus, rules)
    records, problem = load_records(state_dir)
    inputs = DeviceInputs(
        config=model.info.config,
        weights_total_bytes=config.preflight.weights_bytes or model.info.weights_bytes,
        tensor_bytes=model.info.tensor_bytes,
        bytes_per_token=model.bytes_per_token,
        gpu_total_bytes=gpus.total_bytes,
        gpu_free_bytes=gpus.free_bytes,
        env=env,
        layout=model.layout,
    )
    device = device_pool(plan, inputs, latest_for(records, deployment))
    checks = list(device.checks)
    if problem is not None:
        checks.append(Check("measured", Status.WARN, problem))
    return device, deployment, checks


def _report(
    argv: Sequence[str],
    plan: LaunchPlan,
    model: Model,
    gpus: GpuFacts,
    device: Device,
    host: HostAssessment,
    budget: fit.HostBudget,
    numa: Sequence[fit.NumaLoad],
    rules: SglangRules,
    config: SupervisorConfig,
    checks: Sequence[Check],
) -> FitReport:
    safe = host.max_hicache_size_gb
    tokens = device.tokens
    return FitReport(
        model=plan.model_path or model.info.path,
        attention=model_geometry.attention_kind(model.info.config),
        kv_cache_dtype=model.kv_dtype,
        layers_per_rank=model.layers,
        local_ranks=plan.local_ranks,
        bytes_per_token_per_rank=model.bytes_per_token,
        indexer_bytes_per_token_per_rank=model.indexer_bytes_per_token,
        weights_per_rank_bytes=device.weights_per_rank_bytes,
        gpu_memory_bytes=gpus.total_bytes,
        gpu_free_bytes=device.gpu_free_bytes,
        mem_fraction_static=device.mem_fraction,
        device_tokens_per_rank=tokens,
        hicache_mode=host.mode,
        hicache_ratio=host.ratio,
        host_pool_tokens_per_rank=host.pool_tokens,
        host_pool_bytes_per_rank=host.pool_bytes,
        host_required_bytes=host.required_bytes,
        host_budget_bytes=budget.budget_bytes,
        terms=host.terms,
        max_hicache_size_gb=safe,
        equivalent_ratio=(host.safe_host_tokens / tokens) if safe and tokens else None,
        safe_host_tokens_per_rank=host.safe_host_tokens,
        avg_request_tokens=config.preflight.avg_request_tokens,
        sglang_version=rules.version,
        sglang_rules=rules.describe,
        device_tokens_source=device.source,
        checks=tuple(checks),
        suggested_argv=suggested_argv(
            argv,
            safe,
            uses_hicache=plan.uses_hicache,
            fits_without_hicache=host.fits_without_hicache,
        ),
        numa=tuple(
            {"node": n.node, "ranks": n.ranks, "available_bytes": n.available_bytes} for n in numa
        ),
        fits_without_hicache=host.fits_without_hicache,
        pools=report_pools(plan, model, tokens, host),
        host_consumers=tuple(c.to_json() for c in budget.consumers),
    )


def launch_argv(
    argv: Sequence[str],
    safe_size_gb: int,
    *,
    uses_hicache: bool = True,
    fits_without_hicache: bool = True,
) -> tuple[str, ...] | None:
    """The argv that fits: with HiCache, the safe `--hicache-size` substituted (None when not
    even 1 GB fits); without it, the argv unchanged, as `--hicache-size` would be ignored
    (None when the launch does not fit even so)."""
    if not uses_hicache:
        return tuple(argv) if fits_without_hicache else None
    if safe_size_gb <= 0:
        return None
    return _with_flag_value(argv, "--hicache-size", str(safe_size_gb))


def suggested_argv(
    argv: Sequence[str],
    safe_size_gb: int,
    *,
    uses_hicache: bool = True,
    fits_without_hicache: bool = True,
) -> tuple[str, ...] | None:
    """`launch_argv`, secrets redacted (for the report and its JSON)."""
    fitting = launch_argv(
        argv,
        safe_size_gb,
        uses_hicache=uses_hicache,
        fits_without_hicache=fits_without_hicache,
    )
    return None if fitting is None else redact_argv(fitting)
