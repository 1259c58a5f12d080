"""How the simulated server sizes its pools: a transcription of SGLang 0.5.23's own code, kept
apart from the supervisor's pre-flight (supervisor/core/fit.py, model_geometry.py) on purpose.
When the two disagree, a test fails, which is the point of simulating SGLang at all.

Transcribed (paths under sglang/srt/):
- KV bytes per token and rank: `mem_cache/pool_host/mha.py` `get_size_per_token`
  ((head_dim + v_head_dim) * head_num * layer_num * itemsize, head_num from
  `configs/model_config.py` `get_num_kv_heads`: max(1, total_kv_heads // tp)) and
  `pool_host/mla.py` (kv_cache_dim * itemsize * layer_num, kv_cache_dim = kv_lora_rank +
  qk_rope_head_dim, 656 bytes for DeepSeek sparse attention in fp8).
- Host pool: `mem_cache/pool_host/base.py` `HostKVCache.__init__` (size mode
  `int(host_size * 1e9 // size_per_token)`, ratio mode `int(device_tokens * ratio)`, then whole
  pages plus one padding page); the default ratio from `arg_groups/hicache_hook.py`.
- Device pool: `mem_cache/kv_cache_configurator.py` `_profile_available_bytes` and
  `model_executor/pool_configurator.py` `calculate_pool_sizes` (free memory after the weights
  minus free-before × (1 − mem_fraction_static), in GiB, // cell size, floored to pages, capped
  by --max-total-tokens).
- mem_fraction_static when not given: `arg_groups/memory_hook.py`
  `handle_gpu_memory_settings` and `reserve_for_graph_mb`, for a CUDA text model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.testing.args import SimArgs

# Used when --model-path has no readable config.json: Llama-3-70B's geometry.
DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
}
_ITEMSIZE = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "bf16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
_DSA_FP8_ROW_BYTES = 656  # 512 fp8 + 512/128 fp32 scales + 64 bf16 rope dims


def read_model_config(model_path: str) -> dict[str, Any]:
    """config.json of a local model directory, the text model's keys on top (as SGLang's
    `get_hf_text_config` does for multimodal wrappers); Llama-3-70B's when there is none."""
    try:
        raw = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return dict(DEFAULT_MODEL_CONFIG)
    if not isinstance(raw, dict):
        return dict(DEFAULT_MODEL_CONFIG)
    text = raw.get("text_config")
    merged = {k: v for k, v in raw.items() if k != "text_config"}
    if isinstance(text, Mapping):
        merged.update(text)
    return merged


@dataclass(frozen=True, slots=True, kw_only=True)
class Geometry:
    """One rank's KV row: bytes per token (device cell = host row) and the DSA indexer's."""

    size_per_token: int
    indexer_per_token: int
    kind: str  # "MHA" | "MLA" | "DSA": which pool classes SGLang builds
    mla: bool
    v_per_token: int = 0  # MHA: the V half of size_per_token (its log line sizes K and V apart)


def kv_itemsize(config: Mapping[str, Any], kv_cache_dtype: str) -> int:
    if kv_cache_dtype != "auto":
        return _ITEMSIZE.get(kv_cache_dtype, 1)
    quant = config.get("quantization_config") or {}
    if str(quant.get("kv_cache_quant_algo", "")).upper() == "FP8":
        return 1
    dtype = str(config.get("torch_dtype", "bfloat16")).removeprefix("torch.")
    return _ITEMSIZE.get(dtype, 2)


def geometry(config: Mapping[str, Any], args: SimArgs) -> Geometry:
    """The KV row of one rank for this model and launch."""
    layers = -(-int(config["num_hidden_layers"]) // args.pp_size)
    itemsize = kv_itemsize(config, args.kv_cache_dtype)
    if config.get("kv_lora_rank") is not None:
        dim = int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"])
        if config.get("index_head_dim") is not None:
            index = int(config["index_head_dim"])
            row = _DSA_FP8_ROW_BYTES if itemsize == 1 else dim * itemsize
            return Geometry(
                size_per_token=row * layers,
                indexer_per_token=(index + index // 128 * 4) * layers,
                kind="DSA",
                mla=True,
            )
        return Geometry(
            size_per_token=dim * itemsize * layers, indexer_per_token=0, kind="MLA", mla=True
        )
    heads = int(config["num_attention_heads"])
    total_kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    v_head_dim = int(config.get("v_head_dim") or head_dim)
    attn_tp = args.tp_size // max(1, _attn_dp(args))
    head_num = max(1, total_kv // attn_tp)
    size = (head_dim + v_head_dim) * head_num * layers * itemsize
    return Geometry(
        size_per_token=size,
        indexer_per_token=0,
        kind="MHA",
        mla=False,
        v_per_token=v_head_dim * head_num * layers * itemsize,
    )


def _attn_dp(args: SimArgs) -> int:
    if args.attn_dp_size > 1:
        return args.attn_dp_size
    return args.dp_size if args.enable_dp_attention else 1


def _prefill_graph_buckets(max_bs: int) -> int:
    """`generate_prefill_cuda_graph_batch_sizes`: how many prefill graphs are captured."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return sum(1 for s in sizes if s <= max_bs)


def _capacity_defaults(gpu_mib: float, tp_size: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max_bs) by GPU memory capacity in MiB."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if tp_size < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp_size < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp_size < 4 else 512
    return 16384, 512


def mem_fraction_static(gpu_total_bytes: int, args: SimArgs, *, mla: bool) -> float:
    """SGLang's automatic --mem-fraction-static for a CUDA text model (no DeepEP, no spec)."""
    gpu_mib = gpu_total_bytes / (1 << 20)
    chunked, max_bs = _capacity_defaults(gpu_mib, args.tp_size)
    if args.chunked_prefill_size is not None:
        chunked = args.chunked_prefill_size
    reserved = 512 + max(chunked, 2048) * 1.5 + args.tp_size * args.pp_size / 8 * 1024
    graphs = max_bs * 2.0
    attn_dp = _attn_dp(args)
    if attn_dp > 1:
        graphs += max_bs * attn_dp * 3
        if max_bs > 300:
            graphs += max_bs * attn_dp * 1.5
    prefill_max_bs = min(8192, chunked) if mla else chunked
    if args.max_total_tokens is not None:
        prefill_max_bs = min(prefill_max_bs, args.max_total_tokens)
    graphs += 1.5 * 1024 if mla else _prefill_graph_buckets(prefill_max_bs) * 8
    reserved += graphs
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def kv_budget_gib(free_before_bytes: int, weights_bytes: int, mem_fraction: float) -> float:
    """`_profile_available_bytes`: free memory after the weights less the slack, in GiB."""
    pre_gib = free_before_bytes / (1 << 30)
    after_gib = (free_before_bytes - weights_bytes) / (1 << 30)
    return after_gib - pre_gib * (1 - mem_fraction)


def device_tokens(
    *,
    free_before_bytes: int,
    weights_bytes: int,
    mem_fraction: float,
    cell_bytes: int,
    page_size: int,
    max_total_tokens: int | None,
) -> int:
    """`_profile_available_bytes` + `calculate_pool_sizes`: the device KV pool in tokens."""
    rest_gib = kv_budget_gib(free_before_bytes, weights_bytes, mem_fraction)
    if rest_gib <= 0:
        return 0
    budget = int(rest_gib * (1 << 30))
    tokens = budget // cell_bytes // page_size * page_size
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens) // page_size * page_size
    return tokens


def default_ratio(args: SimArgs) -> float:
    """`hicache_hook`: --hicache-ratio unset is 2.0, or 1.2 with buffer_only."""
    return 1.2 if args.hicache_host_memory_mode == "buffer_only" else 2.0


def host_pool_tokens(args: SimArgs, size_per_token: int, device_capacity_tokens: int) -> int:
    """`HostKVCache.__init__`: tokens of one rank's host pool, padding page included."""
    page = args.page_size or 1
    if args.hicache_size > 0:
        size = int(args.hicache_size * 1e9 // size_per_token)
    else:
        ratio = args.hicache_ratio if args.hicache_ratio is not None else default_ratio(args)
        size = int(device_capacity_tokens * ratio)
    page_num = size // page + 1
    return page_num * page
