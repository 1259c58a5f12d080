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

from supervisor.core import fit, model_geometry, weights
from supervisor.core.checks import Check, Status
from supervisor.core.measured import Record, device_settings
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GB, format_gb


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInputs:
    config: Mapping[str, Any]  # the model's config.json (language keys merged)
    weights_total_bytes: int | None  # the checkpoint
    tensor_bytes: Mapping[str, int] | None  # per tensor, from the safetensors headers
    bytes_per_token: int
    gpu_total_bytes: int | None
    gpu_free_bytes: int | None  # F, the CUDA context taken off
    env: Mapping[str, str]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """The device KV pool per rank and what it rests on."""

    mem_fraction: float | None
    weights_per_rank_bytes: int | None
    gpu_free_bytes: int | None
    tokens: int | None
    source: str  # "measured" | "estimate"
    checks: tuple[Check, ...]


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
    per_rank = max(0, split.per_rank_bytes - plan.cpu_offload_gb * GB)
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
