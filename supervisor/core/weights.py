"""GPU memory one rank spends on weights and multimodal reserves before the KV pool is sized.

The checkpoint is not simply divided by TP: SGLang keeps some tensors whole on every rank
(`ReplicatedLinear` and the like), so a rank holds `(total − replicated) / TP + replicated`.
For DeepSeek-V2/V3-style MLA (Kimi-K2, K2.5) the replicated ones are the low-rank projections
`fused_qkv_a_proj_with_mqa` / `kv_a_proj_with_mqa` and the MoE router `gate`
(models/deepseek_v2.py); for Kimi-K2.5's MoonViT tower the MLPs and the projector
(models/kimi_vl_moonvit.py `MLP2`, models/kimi_k25.py `K2VLMultiModalProjector`). With the
checkpoint's tensor list (safetensors headers) the names decide; without it the sizes follow
from config.json. A multimodal model also holds back SGLANG_VLM_CACHE_SIZE_MB (default 100 MB)
of the KV budget (mem_cache/kv_cache_configurator.py `mm_runtime_reservation_gb`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.core.sglang_facts import VLM_CACHE_ENV
from supervisor.core.units import MiB

# Tensor names SGLang loads into replicated layers (the suffix after the layer prefix). Compiled
# at the first safetensors split (re caches it), not at import: a plan without the shards never
# uses it.
_REPLICATED_NAME = (
    r"(q_a_proj|kv_a_proj_with_mqa|q_a_layernorm|kv_a_layernorm|mlp\.gate\.weight"
    r"|e_score_correction_bias|layernorm|\.norm\.|norm\.weight$"
    r"|vision_tower\..*\.mlp\.|mm_projector\.|multi_modal_projector\.)"
)
VLM_CACHE_DEFAULT_MB = 100  # environ.py SGLANG_VLM_CACHE_SIZE_MB
_BYTES_PER_PARAM = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class RankWeights:
    """One rank's share of the checkpoint."""

    per_rank_bytes: int
    replicated_bytes: int  # of the checkpoint, held whole by every rank
    source: str  # "safetensors headers" | "config.json" | "even split"


def is_replicated(name: str) -> bool:
    """A checkpoint tensor SGLang loads whole on every rank."""
    return re.search(_REPLICATED_NAME, name) is not None


def replicated_from_tensors(tensor_bytes: Mapping[str, int]) -> int:
    """Bytes of the tensors SGLang replicates, by name (from the safetensors headers)."""
    replicated = re.compile(_REPLICATED_NAME)
    return sum(size for name, size in tensor_bytes.items() if replicated.search(name))


def _int(config: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def replicated_from_config(config: Mapping[str, Any]) -> int:
    """Bytes SGLang replicates, from config.json alone (MLA projections, MoE router, ViT MLPs)."""
    width = _BYTES_PER_PARAM.get(str(config.get("torch_dtype", "bfloat16")), 2)
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    params = 0
    kv_lora = _int(config, "kv_lora_rank")
    if kv_lora:
        rope = _int(config, "qk_rope_head_dim")
        params += layers * hidden * (_int(config, "q_lora_rank") + kv_lora + rope)
    experts = _int(config, "n_routed_experts")
    if experts:
        moe_layers = layers - _int(config, "first_k_dense_replace")
        params += moe_layers * experts * hidden
    vision = config.get("vision_config")
    if isinstance(vision, Mapping) and kv_lora:  # MoonViT beside an MLA language model
        vt_hidden = _int(vision, "hidden_size", 1152)
        vt_mlp = _int(vision, "intermediate_size", 4304)
        params += _int(vision, "num_hidden_layers", 27) * 2 * vt_hidden * vt_mlp
        merged = vt_hidden * 4  # 2 x 2 patch merge
        params += merged * merged + merged * hidden
    return params * width


def rank_weights(
    total_bytes: int,
    config: Mapping[str, Any],
    *,
    tp_size: int,
    pp_size: int,
    tensor_bytes: Mapping[str, int] | None = None,
) -> RankWeights:
    """One rank's weights: the split part divided over TP, the replicated part whole, the
    pipeline stage a 1/PP share of both."""
    if tensor_bytes:
        replicated, source = replicated_from_tensors(tensor_bytes), "safetensors headers"
    else:
        replicated, source = replicated_from_config(config), "config.json"
        if not replicated:
            source = "even split"
    replicated = min(replicated, total_bytes)
    per_stage = (total_bytes - replicated) // tp_size + replicated
    return RankWeights(
        per_rank_bytes=per_stage // pp_size, replicated_bytes=replicated, source=source
    )


def is_multimodal(config: Mapping[str, Any]) -> bool:
    return isinstance(config.get("vision_config"), Mapping)


def multimodal_reserve_bytes(config: Mapping[str, Any], env: Mapping[str, str]) -> int:
    """GPU memory SGLang keeps out of the KV pool for a multimodal model's embedding cache."""
    if not is_multimodal(config):
        return 0
    raw = env.get(VLM_CACHE_ENV, "")
    try:
        megabytes = int(raw) if raw else VLM_CACHE_DEFAULT_MB
    except ValueError:
        megabytes = VLM_CACHE_DEFAULT_MB
    return max(0, megabytes) * MiB
