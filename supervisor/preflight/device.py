"""The device KV pool per rank: (F·m − W − R) / cell (docs/sglang.md §1.4), from SGLang's own
measurement of an earlier launch of this deployment when there is one, else estimated.

F is the free GPU memory before the weights, W one rank's weights (the replicated tensors
whole, core/weights.py), R the multimodal reserve, m --mem-fraction-static (or SGLang's
automatic value). A measurement gives F and W as SGLang saw them; when the flags that size the
pool are also the same, its token count is used as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from supervisor.core import fit, model_geometry, pools, weights
from supervisor.core.checks import Check, Status
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.measured import Record, device_settings
from supervisor.core.pools import Pool
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GiB, format_gb


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInputs:
    config: Mapping[str, Any]  # the model's config.json (language keys merged)
    weights_total_bytes: int | None  # the checkpoint
    tensor_bytes: Mapping[str, int] | None  # per tensor, from the safetensors headers
    bytes_per_token: int
    gpu_total_bytes: int | None
    gpu_free_bytes: int | None  # F, the CUDA context taken off
    env: Mapping[str, str]
    layout: HybridLayout | None = None  # a hybrid model's pools (None: one pool of all layers)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """The device KV pool per rank and what it rests on."""

    mem_fraction: float | None
    weights_per_rank_bytes: int | None
    gpu_free_bytes: int | None
    tokens: int | None
    source: str  # "measured" | "estimate"
    checks: tuple[Check, ...]
    pools: tuple[Pool, ...] | None = None  # a hybrid model's device pools (None: one, or unknown)


def _rank_weights(plan: LaunchPlan, inputs: DeviceInputs) -> tuple[int | None, str]:
    if inputs.weights_total_bytes is None:
        return None, ""
    split = weights.rank_weights(
        inputs.weights_total_bytes,
        inputs.config,
        tp_size=plan.tp_size,
        pp_size=plan.pp_size,
        tensor_bytes=inputs.tensor_bytes,
    )
    # --cpu-offload-gb is GiB per rank (utils/offloader.py:68-72).
    per_rank = max(0, split.per_rank_bytes - plan.cpu_offload_gb * GiB)
    replicated = format_gb(split.replicated_bytes)
    how = f"replicated {replicated} from {split.source}" if split.replicated_bytes else "split"
    return per_rank, how


def device_pool(plan: LaunchPlan, inputs: DeviceInputs, measured: Record | None) -> Device:
    """The device pool per rank, and a check saying where the number comes from."""
    mem_fraction = plan.mem_fraction_static
    if mem_fraction is None and inputs.gpu_total_bytes is not None:
        mla = model_geometry.is_mla(inputs.config)
        mem_fraction = fit.auto_mem_fraction_static(inputs.gpu_total_bytes, plan, mla=mla)
    per_rank, how = _rank_weights(plan, inputs)
    free = inputs.gpu_free_bytes
    if inputs.layout is not None:
        return _hybrid(plan, inputs, inputs.layout, measured, (mem_fraction, per_rank, free, how))
    if measured is not None:
        per_rank = measured.measurement.weights_bytes
        free = measured.measurement.pre_load_free_bytes
        if dict(measured.settings) == device_settings(plan):
            tokens = measured.measurement.device_tokens
            detail = f"{tokens:,} KV tokens per rank on the GPU, as SGLang measured it"
            return Device(
                mem_fraction=mem_fraction,
                weights_per_rank_bytes=per_rank,
                gpu_free_bytes=free,
                tokens=tokens,
                source="measured",
                checks=(Check("device_kv", Status.OK, detail),),
            )
        how = "as SGLang measured them"
    if free is None or mem_fraction is None or per_rank is None:
        return _unknown(mem_fraction, per_rank, free)
    reserve = weights.multimodal_reserve_bytes(inputs.config, inputs.env)
    tokens = fit.estimate_device_tokens(
        gpu_free_bytes=free,
        weights_per_rank_bytes=per_rank,
        mem_fraction_static=mem_fraction,
        bytes_per_token=inputs.bytes_per_token,
        page_size=plan.effective_page_size,
        max_total_tokens=plan.max_total_tokens,
        reserved_bytes=reserve,
    )
    return Device(
        mem_fraction=mem_fraction,
        weights_per_rank_bytes=per_rank,
        gpu_free_bytes=free,
        tokens=tokens,
        source="estimate",
        checks=(_estimate_check(tokens, per_rank, how, reserve),),
    )


def _unknown(mem_fraction: float | None, per_rank: int | None, free: int | None) -> Device:
    """No device pool: the GPU, the fraction or the weights are unknown."""
    checks: tuple[Check, ...] = ()
    if free is not None and per_rank is None:
        detail = "weights size unknown (no *.safetensors here): set [preflight] weights"
        checks = (Check("device_kv", Status.WARN, detail),)
    return Device(
        mem_fraction=mem_fraction,
        weights_per_rank_bytes=per_rank,
        gpu_free_bytes=free,
        tokens=None,
        source="estimate",
        checks=checks,
    )


def _estimate_check(tokens: int, per_rank: int, how: str, reserve: int) -> Check:
    if tokens == 0:
        detail = "loaded weights leave no GPU memory for the KV cache"
        return Check("device_kv", Status.FAIL, detail)
    extra = f", multimodal reserve {format_gb(reserve)}" if reserve else ""
    detail = (
        f"≈ {tokens:,} KV tokens per rank on the GPU (estimate: weights "
        f"{format_gb(per_rank)}/rank, {how}{extra}; exact after the first run)"
    )
    return Check("device_kv", Status.OK, detail)


def _measured_pools(
    layout: HybridLayout, plan: LaunchPlan, record: Record
) -> tuple[Pool, ...] | None:
    """The device pools as SGLang logged them, when the record has each of them (records
    written before the pools were read apart have none: their token count is the last pool's)."""
    logged = record.measurement.device_pools or {}
    names = ("full", "swa") if layout.kind == "swa" else ("mamba", "kv")
    if any(name not in logged for name in names):
        return None
    if layout.kind == "swa":
        full, swa = pools.swa_pools(layout, plan, logged["full"])
        return (full, dataclasses.replace(swa, device=logged["swa"]))
    return pools.mamba_pools(layout, plan, logged["kv"], logged["mamba"])


def _described(built: tuple[Pool, ...]) -> str:
    return ", ".join(f"{p.device or 0:,} {p.unit} in the {p.name} pool" for p in built)


def _hybrid(
    plan: LaunchPlan,
    inputs: DeviceInputs,
    layout: HybridLayout,
    measured: Record | None,
    known: tuple[float | None, int | None, int | None, str],
) -> Device:
    """A hybrid model's device pools: as SGLang logged them, else solved from F × m − W − R."""
    fraction, per_rank, free, how = known
    if measured is not None:
        per_rank = measured.measurement.weights_bytes
        free = measured.measurement.pre_load_free_bytes
        how = "as SGLang measured them"
        logged = None
        if dict(measured.settings) == device_settings(plan):
            logged = _measured_pools(layout, plan, measured)
        if logged is not None:
            detail = f"per rank on the GPU: {_described(logged)}, as SGLang measured them"
            return Device(
                mem_fraction=fraction,
                weights_per_rank_bytes=per_rank,
                gpu_free_bytes=free,
                tokens=pools.anchor(logged).device,
                source="measured",
                checks=(Check("device_kv", Status.OK, detail),),
                pools=logged,
            )
    if free is None or fraction is None or per_rank is None:
        return _unknown(fraction, per_rank, free)
    reserve = weights.multimodal_reserve_bytes(inputs.config, inputs.env)
    built = pools.device_pools(
        layout, plan, pools.kv_budget_bytes(free, per_rank, fraction, reserve)
    )
    problem = pools.device_problem(layout, plan, built)
    tokens = pools.anchor(built).device or 0
    if problem is not None or tokens == 0:
        check = Check(
            "device_kv",
            Status.FAIL,
            problem or "loaded weights leave no GPU memory for the KV cache",
        )
    else:
        extra = f", multimodal reserve {format_gb(reserve)}" if reserve else ""
        detail = (
            f"≈ per rank on the GPU: {_described(built)} (estimate: weights "
            f"{format_gb(per_rank)}/rank, {how}{extra}; exact after the first run)"
        )
        check = Check("device_kv", Status.OK, detail)
    return Device(
        mem_fraction=fraction,
        weights_per_rank_bytes=per_rank,
        gpu_free_bytes=free,
        tokens=tokens,
        source="estimate",
        checks=(check,),
        pools=built,
    )
