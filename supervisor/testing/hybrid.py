"""How the simulated server sizes a hybrid model's pools: a transcription of SGLang 0.5.23's code,
written from it and kept apart from the supervisor's (supervisor/core/pools.py), so that the two
can disagree in a test.

Transcribed (paths under sglang/srt/):
- Which layers are which: `configs/model_config.py` `is_hybrid_swa_model` and
  `get_hybrid_layer_ids` (GptOss by `layer_types`, Llama-4 every 4th layer full),
  `arg_groups/model_overrides/gemma2_gemma3.py` (Gemma-2/3: one pool), `configs/qwen3_next.py`
  `layers_block_type`, `configs/nemotron_h.py` (`hybrid_override_pattern`).
- The Mamba state: `configs/mamba_utils.py` `Mamba2StateShape.create`, `mamba2_state_dtype`.
- The device pools: `model_executor/pool_configurator.py` `HybridSWAPoolConfigurator`
  (`_recompute_cell_size`, `_solve_pool_sizes`), `DefaultPoolConfigurator` (the KV cell of the
  attention layers only), `mem_cache/kv_cache_configurator.py` `_profile_available_bytes` and
  `_handle_max_mamba_cache` (in GiB, as SGLang reckons), `distributed/utils.py` `get_pp_indices`.
- The host pools: `mem_cache/hybrid_cache/hybrid_pool_assembler.py` `_split_hicache_size`,
  `build_hybrid_swa_stack`, `build_hybrid_mamba_stack`; `mem_cache/pool_host/base.py` and
  `pool_host/mamba.py` (whole pages + 1, slots + 1).
Not simulated: PP stages with different pools (every rank takes stage 0's), speculative drafts,
SGLANG_MAMBA_* variables, the unified memory pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from supervisor.testing.args import SimArgs

_GIB = 1 << 30
_SWA_SINK = {"GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM"}
_SWA_SINK |= {"IQuestQ1ForCausalLM"}
_STATE_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class SimPool:
    """One device pool and its host mirror, in the order SGLang builds (and logs) them."""

    label: str  # the device log line's: "Full", "SWA", "" (a Mamba hybrid's KV pool), "Mamba"
    host_label: str  # the host log line's: "full", "swa", "kv", "mamba"
    size: int  # tokens; Mamba: state slots
    k_row: int  # bytes per token of K over the pool's layers; Mamba: conv state per slot
    v_row: int  # the V half; Mamba: SSM state per slot
    pad: int  # rows past `size`: the padded page; Mamba: one slot
    host_size: int = 0

    @property
    def row(self) -> int:
        return self.k_row + self.v_row

    @property
    def device_bytes(self) -> int:
        return (self.size + self.pad) * self.row


def _arch(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures") or [""]
    return str(archs[0])


def _layer_kinds(config: Mapping[str, Any], args: SimArgs) -> list[str] | None:
    """ "full" / "swa" / "mamba" / "none" per layer, or None: SGLang keeps one pool."""
    arch, layers = _arch(config), config.get("num_hidden_layers")
    if arch in _SWA_SINK and not args.disable_hybrid_swa_memory:
        kinds = {"sliding_attention": "swa", "full_attention": "full"}
        return [kinds.get(t, "none") for t in config["layer_types"]]
    if arch == "Llama4ForConditionalGeneration" and not args.disable_hybrid_swa_memory:
        return ["swa" if (i + 1) % 4 else "full" for i in range(int(layers or 0))]
    if arch == "Qwen3NextForCausalLM":
        every = int(config["full_attention_interval"])
        return ["full" if (i + 1) % every == 0 else "mamba" for i in range(int(layers or 0))]
    if arch == "NemotronHForCausalLM":
        marks = {"M": "mamba", "*": "full"}
        return [marks.get(c, "none") for c in str(config["hybrid_override_pattern"])]
    return None


def _stage(kinds: Sequence[str], pp_size: int) -> Sequence[str]:
    """Stage 0's layers (`get_pp_indices`: the remainder goes to the last stages)."""
    return kinds[: len(kinds) // pp_size]


def _attn_tp(args: SimArgs) -> int:
    attn_dp = args.attn_dp_size if args.attn_dp_size > 1 else 1
    if args.enable_dp_attention and attn_dp == 1:
        attn_dp = args.dp_size
    return args.tp_size // attn_dp


def _kv_half_per_layer(config: Mapping[str, Any], args: SimArgs, itemsize: int) -> int:
    """K (= V) bytes of one token in one layer: `get_num_kv_heads` × head_dim × itemsize."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return max(1, kv_heads // _attn_tp(args)) * head_dim * itemsize


def _state_per_layer(config: Mapping[str, Any], args: SimArgs) -> tuple[int, int]:
    """(conv, SSM) bytes of one slot in one layer: `Mamba2StateShape.create`."""
    tp = _attn_tp(args)
    if _arch(config) == "Qwen3NextForCausalLM":
        heads, head_dim = config["linear_num_value_heads"], config["linear_value_head_dim"]
        groups, state = config["linear_num_key_heads"], config["linear_key_head_dim"]
        kernel = config["linear_conv_kernel_dim"]
    else:
        heads, head_dim = config["mamba_num_heads"], config["mamba_head_dim"]
        groups, state, kernel = config["n_groups"], config["ssm_state_size"], config["conv_kernel"]
    if groups % tp != 0:
        groups += tp - groups  # extra_groups_for_head_shards
    conv_dim = heads * head_dim + 2 * groups * state
    ssm_name = args.mamba_ssm_dtype or config.get("mamba_ssm_dtype") or "float32"
    ssm_size = _STATE_DTYPES.get(str(ssm_name), 4)
    return conv_dim // tp * (kernel - 1) * 2, heads // tp * head_dim * state * ssm_size


def _swa(
    config: Mapping[str, Any], args: SimArgs, kinds: Sequence[str], rest_gib: float, item: int
) -> list[SimPool]:
    page = args.page_size or 1
    half = _kv_half_per_layer(config, args, item)
    full_half, swa_half = half * kinds.count("full"), half * kinds.count("swa")
    ratio = args.swa_full_tokens_ratio if args.swa_full_tokens_ratio is not None else 0.8
    cell = 2 * full_half + ratio * 2 * swa_half
    total = int(int(rest_gib * _GIB) // cell)
    if args.max_total_tokens is not None:
        total = min(total // page * page, args.max_total_tokens)
    full = total // page * page
    swa = int(full * ratio) // page * page
    return [
        SimPool(
            label="Full", host_label="full", size=full, k_row=full_half, v_row=full_half, pad=page
        ),
        SimPool(label="SWA", host_label="swa", size=swa, k_row=swa_half, v_row=swa_half, pad=page),
    ]


def _mamba(
    config: Mapping[str, Any], args: SimArgs, kinds: Sequence[str], rest_gib: float, item: int
) -> list[SimPool]:
    page = args.page_size or 1
    conv, ssm = (n * kinds.count("mamba") for n in _state_per_layer(config, args))
    per_req = conv + ssm
    ratio = args.mamba_full_memory_ratio if args.mamba_full_memory_ratio is not None else 0.9
    if args.max_mamba_cache_size is not None:
        slots = args.max_mamba_cache_size
    else:
        budget = rest_gib * ratio / (1 + ratio) * _GIB
        slots = int((budget - per_req) // per_req)
    rest_gib -= (slots + 1) * per_req / _GIB
    half = _kv_half_per_layer(config, args, item) * kinds.count("full")
    tokens = int(rest_gib * _GIB) // (2 * half) // page * page
    if args.max_total_tokens is not None:
        tokens = min(tokens, args.max_total_tokens) // page * page
    return [
        SimPool(label="Mamba", host_label="mamba", size=slots, k_row=conv, v_row=ssm, pad=1),
        SimPool(label="", host_label="kv", size=tokens, k_row=half, v_row=half, pad=page),
    ]


def device_pools(
    config: Mapping[str, Any], args: SimArgs, rest_gib: float, itemsize: int
) -> list[SimPool] | None:
    """The device pools of a hybrid model from `rest_gib` (what `_profile_available_bytes` has
    left after the slack), in SGLang's order; None for a model of one pool."""
    kinds = _layer_kinds(config, args)
    if kinds is None:
        return None
    stage = _stage(kinds, args.pp_size)
    if "mamba" in stage:
        return _mamba(config, args, stage, rest_gib, itemsize)
    return _swa(config, args, stage, rest_gib, itemsize)


def with_host_pools(args: SimArgs, pools: Sequence[SimPool], ratio: float) -> list[SimPool]:
    """Each pool with its host pool: `--hicache-size` split by device bytes, else `ratio`."""
    page = args.page_size or 1
    total = sum(p.device_bytes for p in pools)
    sized = []
    for p in pools:
        if args.hicache_size > 0:
            share = args.hicache_size * p.device_bytes / total
            size = int(share * 1e9 // p.row)
        else:
            size = int(p.size * ratio)
        host = size + 1 if p.label == "Mamba" else (size // page + 1) * page
        sized.append(replace(p, host_size=host))
    return sized
