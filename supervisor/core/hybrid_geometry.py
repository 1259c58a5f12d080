"""Hybrid models' layers: which hold full attention, a sliding window or a Mamba (linear
attention) state, and the bytes of one row of each of their pools on one rank.

SGLang 0.5.23 builds separate pools for them (docs/sglang.md §1.9): a sliding-window model gets a
full pool and an SWA pool (configs/model_config.py `is_hybrid_swa_model`, `get_hybrid_layer_ids`),
a Mamba/GDN hybrid a KV pool over its attention layers and a Mamba state pool of per-request slots
(configs/hybrid_arch.py `mambaish_config`, configs/mamba_utils.py `Mamba2StateShape.create`).
Only the architectures below are modelled; any other keeps one pool over all its layers, which is
what SGLang does for them too (Gemma-2/3 turn hybrid SWA memory off:
arg_groups/model_overrides/gemma2_gemma3.py:13-26).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core.bounded import shown
from supervisor.core.model_geometry import GeometryError, kv_row_bytes
from supervisor.core.sglang_args import LaunchPlan

# Sliding-window models whose layers follow `layer_types` (configs/model_config.py:88-96
# SWA_SINK_ARCHS, read by get_hybrid_layer_ids).
_LAYER_TYPES_SWA = frozenset(
    {
        "GptOssForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "IQuestQ1ForCausalLM",
    }
)
# Llama-4: every fourth layer is full attention, the others chunked (get_hybrid_layer_ids).
_LLAMA4 = "Llama4ForConditionalGeneration"
# Gated DeltaNet: every `full_attention_interval`-th layer is attention (configs/qwen3_next.py
# `layers_block_type`), the others keep a conv and an SSM state.
_GDN = frozenset({"Qwen3NextForCausalLM"})
# Mamba-2: `hybrid_override_pattern`, M a Mamba layer, * an attention layer, - and E an MLP or MoE
# without any cache (configs/nemotron_h.py `mamba_layer_ids`, `full_attention_layer_ids`).
_NEMOTRON_H = frozenset({"NemotronHForCausalLM"})
_LAYER_KINDS = ("sliding_attention", "full_attention")
# configs/mamba_utils.py `mamba2_state_dtype`: conv bf16 (SGLANG_MAMBA_CONV_DTYPE), SSM float32
# unless `--mamba-ssm-dtype`, SGLANG_MAMBA_SSM_DTYPE or the config's mamba_ssm_dtype says else.
_STATE_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
MAMBA_CONV_DTYPE_ENV = "SGLANG_MAMBA_CONV_DTYPE"
MAMBA_SSM_DTYPE_ENV = "SGLANG_MAMBA_SSM_DTYPE"


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridLayout:
    """What one rank holds of a hybrid model, per pool (rows in bytes per token or slot)."""

    kind: str  # "swa" | "mamba"
    full_layers: int
    swa_layers: int = 0
    mamba_layers: int = 0
    full_row_bytes: int  # one token in every full-attention layer
    swa_row_bytes: int = 0  # one token in every sliding-window layer
    mamba_slot_bytes: int = 0  # one request's conv + SSM state in every Mamba layer
    window_tokens: int | None = None  # the sliding window (SGLang refuses a smaller SWA pool)


def _architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else ""


def _positive(config: Mapping[str, Any], key: str, *, required: bool = True) -> int | None:
    value = config.get(key)
    if value is None and not required:
        return None
    if value is None:
        raise GeometryError(f"config lacks {key}, which this hybrid model's pools are sized by")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise GeometryError(f"config key {key} must be a positive integer, got {shown(value)}")
    return value


def _num_layers(config: Mapping[str, Any]) -> int:
    value = _positive(config, "num_hidden_layers")
    assert value is not None  # required
    return value


def stage_layers(total: int, pp_size: int) -> list[range]:
    """Each pipeline stage's layers: an even split, the remainder on the last stages
    (distributed/utils.py:110-150 `get_pp_indices`, without SGLANG_PP_LAYER_PARTITION)."""
    base, extra = divmod(total, pp_size)
    stages, start = [], 0
    for rank in range(pp_size):
        size = base + (1 if rank >= pp_size - extra else 0)
        stages.append(range(start, start + size))
        start += size
    return stages


def _per_stage_max(kinds: Sequence[str], pp_size: int, kind: str) -> int:
    """The most layers of `kind` any stage holds: the binding rank's pool."""
    stages = stage_layers(len(kinds), pp_size)
    return max(sum(1 for i in stage if kinds[i] == kind) for stage in stages)


def _swa_kinds(config: Mapping[str, Any], arch: str) -> list[str]:
    layers = _num_layers(config)
    if arch == _LLAMA4:
        return ["full" if (i + 1) % 4 == 0 else "swa" for i in range(layers)]
    types = config.get("layer_types")
    if not isinstance(types, list):
        raise GeometryError(f"config lacks layer_types (a list), which {arch} is sized by")
    if len(types) != layers:
        raise GeometryError(
            f"config key layer_types has {len(types)} entries, num_hidden_layers is {layers}"
        )
    for i, kind in enumerate(types):
        if kind not in _LAYER_KINDS:
            raise GeometryError(
                f"config key layer_types[{i}] is {shown(kind)}: SGLang knows "
                f"{' and '.join(_LAYER_KINDS)}"
            )
    return ["swa" if kind == "sliding_attention" else "full" for kind in types]


def _swa_layout(config: Mapping[str, Any], plan: LaunchPlan, arch: str) -> HybridLayout:
    kinds = _swa_kinds(config, arch)
    window_key = "attention_chunk_size" if arch == _LLAMA4 else "sliding_window"
    window = _positive(config, window_key, required=arch != _LLAMA4)
    full = _per_stage_max(kinds, plan.pp_size, "full")
    swa = _per_stage_max(kinds, plan.pp_size, "swa")
    return HybridLayout(
        kind="swa",
        full_layers=full,
        swa_layers=swa,
        full_row_bytes=kv_row_bytes(config, plan, full),
        swa_row_bytes=kv_row_bytes(config, plan, swa),
        window_tokens=window,
    )


def _mamba_kinds(config: Mapping[str, Any], arch: str) -> list[str]:
    if arch in _NEMOTRON_H:
        pattern = config.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern:
            raise GeometryError("config lacks hybrid_override_pattern, which NemotronH is sized by")
        layers = config.get("num_hidden_layers")
        if layers is not None and layers != len(pattern):
            raise GeometryError(
                f"config key hybrid_override_pattern has {len(pattern)} layers, "
                f"num_hidden_layers is {shown(layers)}"
            )
        return ["full" if c == "*" else "mamba" if c == "M" else "none" for c in pattern]
    interval = _positive(config, "full_attention_interval")
    assert interval is not None  # required
    return ["full" if (i + 1) % interval == 0 else "mamba" for i in range(_num_layers(config))]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _state_itemsizes(
    config: Mapping[str, Any], plan: LaunchPlan, env: Mapping[str, str]
) -> tuple[int, int]:
    """(conv, SSM) bytes per element (configs/mamba_utils.py `mamba2_state_dtype`): the SSM state
    is float32 unless the config's mamba_ssm_dtype says else, SGLANG_MAMBA_SSM_DTYPE overrides
    it, and `--mamba-ssm-dtype` overrides both (arg_groups/serving_hook.py:439-440 sets the
    variable); names SGLang does not know are ignored as it ignores them."""
    conv = _STATE_ITEMSIZE.get(env.get(MAMBA_CONV_DTYPE_ENV, ""), 2)
    ssm = 4
    for name in (config.get("mamba_ssm_dtype"), env.get(MAMBA_SSM_DTYPE_ENV), plan.mamba_ssm_dtype):
        ssm = _STATE_ITEMSIZE.get(str(name), ssm) if name is not None else ssm
    return conv, ssm


# (intermediate heads key, head dim key, groups key, state size key, conv kernel key) per family;
# the intermediate size is heads × head dim in both (configs/qwen3_next.py, configs/nemotron_h.py).
_GDN_KEYS = (
    "linear_num_value_heads",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_conv_kernel_dim",
)
_MAMBA2_KEYS = ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel")


def mamba_layer_state_bytes(
    config: Mapping[str, Any], plan: LaunchPlan, env: Mapping[str, str]
) -> int:
    """One request's conv + SSM state in one Mamba layer of one rank (configs/mamba_utils.py:
    195-240 `Mamba2StateShape.create`): conv (intermediate + 2 × groups × state) / TP ×
    (kernel − 1) elements, SSM heads / TP × head dim × state elements. Groups that TP does not
    divide are widened to TP (`extra_groups_for_head_shards`)."""
    keys = _MAMBA2_KEYS if _architecture(config) in _NEMOTRON_H else _GDN_KEYS
    heads, head_dim, groups, state, kernel = (_positive(config, k) or 0 for k in keys)
    tp = plan.attention_tp_size
    if groups % tp:
        groups = tp
    conv_elements = _ceil_div(heads * head_dim + 2 * groups * state, tp) * (kernel - 1)
    ssm_elements = _ceil_div(heads, tp) * head_dim * state
    conv_size, ssm_size = _state_itemsizes(config, plan, env)
    return conv_elements * conv_size + ssm_elements * ssm_size


def mamba_split_problem(config: Mapping[str, Any], plan: LaunchPlan) -> str | None:
    """Why SGLang cannot split the Mamba state over the attention TP, or None (its `divide`
    asserts: the conv channels and the SSM heads must divide by TP)."""
    if hybrid_kind(config, plan) != "mamba":
        return None
    keys = _MAMBA2_KEYS if _architecture(config) in _NEMOTRON_H else _GDN_KEYS
    heads, head_dim, groups, state, _kernel = (_positive(config, k) or 0 for k in keys)
    tp = plan.attention_tp_size
    groups = tp if groups % tp else groups
    if heads % tp or (heads * head_dim + 2 * groups * state) % tp:
        return f"attention TP {tp} does not divide the {heads} Mamba heads ({keys[0]})"
    return None


def hybrid_kind(config: Mapping[str, Any], plan: LaunchPlan) -> str | None:
    """ "swa", "mamba", or None for a model SGLang keeps in one pool."""
    arch = _architecture(config)
    if arch in _GDN or arch in _NEMOTRON_H:
        return "mamba"
    if arch in _LAYER_TYPES_SWA or arch == _LLAMA4:
        return None if plan.disable_hybrid_swa_memory else "swa"
    return None


def hybrid_layout(
    config: Mapping[str, Any], plan: LaunchPlan, env: Mapping[str, str]
) -> HybridLayout | None:
    """The pools one rank of this model holds, or None when SGLang keeps one pool of all layers.

    Raises:
        GeometryError: a key the pools are sized by is missing or wrong (the message names it):
            `layer_types` of another length than the layers, a window of 0 or less, a Mamba
            model without its state sizes.
    """
    kind = hybrid_kind(config, plan)
    if kind is None:
        return None
    arch = _architecture(config)
    if kind == "swa":
        return _swa_layout(config, plan, arch)
    kinds = _mamba_kinds(config, arch)
    full = _per_stage_max(kinds, plan.pp_size, "full")
    mamba = _per_stage_max(kinds, plan.pp_size, "mamba")
    return HybridLayout(
        kind="mamba",
        full_layers=full,
        mamba_layers=mamba,
        full_row_bytes=kv_row_bytes(config, plan, full),
        mamba_slot_bytes=mamba_layer_state_bytes(config, plan, env) * mamba,
    )
