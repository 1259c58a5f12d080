"""One rank's weights: the replicated tensors whole, the rest divided; the multimodal reserve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor.core import weights
from supervisor.core.units import GB, MiB

ROOT = Path(__file__).resolve().parents[2]


def kimi() -> dict[str, Any]:
    raw = json.loads((ROOT / "configs" / "models" / "kimi-k2.5" / "config.json").read_text())
    return {**{k: v for k, v in raw.items() if k != "text_config"}, **raw["text_config"]}


def test_kimi_k2_5_replicates_its_mla_projections_router_and_vit_mlps():
    config = kimi()
    mla = 61 * 7168 * (1536 + 512 + 64)  # fused_qkv_a_proj_with_mqa
    router = 60 * 384 * 7168  # MoE gate in every layer but the first (dense) one
    vit = 27 * 2 * 1152 * 4304 + 4608 * 4608 + 4608 * 7168  # MoonViT MLPs + projector
    assert weights.replicated_from_config(config) == 2 * (mla + router + vit)


def test_a_dense_model_replicates_nothing_and_splits_evenly():
    llama = {"hidden_size": 8192, "num_hidden_layers": 80, "torch_dtype": "bfloat16"}
    split = weights.rank_weights(140 * GB, llama, tp_size=8, pp_size=1)
    assert (split.per_rank_bytes, split.replicated_bytes, split.source) == (
        140 * GB // 8,
        0,
        "even split",
    )


def test_the_replicated_part_is_held_whole_by_every_rank():
    split = weights.rank_weights(595 * GB, kimi(), tp_size=8, pp_size=1)
    replicated = weights.replicated_from_config(kimi())
    assert split.per_rank_bytes == (595 * GB - replicated) // 8 + replicated
    assert split.source == "config.json"


def test_tensor_names_decide_when_the_headers_were_read():
    tensors = {
        "language_model.model.layers.3.self_attn.fused_qkv_a_proj_with_mqa.weight": 30_000_000,
        "language_model.model.layers.3.self_attn.kv_a_proj_with_mqa.weight": 8_000_000,
        "language_model.model.layers.3.self_attn.q_b_proj.weight": 20_000_000,
        "language_model.model.layers.3.mlp.gate.weight": 5_500_000,
        "language_model.model.layers.3.mlp.gate_proj.weight": 9_000_000,
        "language_model.model.layers.3.mlp.experts.7.down_proj.weight_packed": 4_000_000,
        "vision_tower.encoder.blocks.0.mlp.fc0.weight": 10_000_000,
        "vision_tower.encoder.blocks.0.wqkv.weight": 8_000_000,
        "mm_projector.proj.0.weight": 42_000_000,
    }
    assert (
        weights.replicated_from_tensors(tensors)
        == 30_000_000 + 8_000_000 + 5_500_000 + 10_000_000 + 42_000_000
    )
    split = weights.rank_weights(
        sum(tensors.values()), {}, tp_size=2, pp_size=1, tensor_bytes=tensors
    )
    assert split.source == "safetensors headers"


def test_a_multimodal_model_holds_back_sglang_s_vlm_cache():
    assert weights.multimodal_reserve_bytes(kimi(), {}) == 100 * MiB
    assert (
        weights.multimodal_reserve_bytes(kimi(), {"SGLANG_VLM_CACHE_SIZE_MB": "512"}) == 512 * MiB
    )
    assert weights.multimodal_reserve_bytes({"hidden_size": 1}, {}) == 0
