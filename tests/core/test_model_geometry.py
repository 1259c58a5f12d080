"""KV bytes per token per rank for real model geometries (docs/sglang.md §7 table)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.model_geometry import (
    GeometryError,
    attention_kind,
    bytes_per_token_per_rank,
    indexer_bytes_per_token_per_rank,
    kv_cache_dtype,
    kv_heads_per_rank,
    layers_per_rank,
    tp_split_problem,
)
from supervisor.core.sglang_args import parse_launch_args

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"


def model(name: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    merged = {k: v for k, v in raw.items() if k != "text_config"}
    merged.update(raw.get("text_config", {}))
    return merged


def plan(*args: str):
    return parse_launch_args(["--model-path", "m", *args])


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("llama-3-70b", ("--tp", "1"), 327_680),
        ("llama-3-70b", ("--tp", "8"), 40_960),
        ("llama-3-70b", ("--tp", "8", "--kv-cache-dtype", "fp8_e4m3"), 20_480),
        ("deepseek-v3", ("--tp", "1"), 70_272),
        ("deepseek-v3", ("--tp", "8"), 70_272),
        ("deepseek-v3", ("--tp", "16"), 70_272),
        ("deepseek-v3", ("--tp", "8", "--kv-cache-dtype", "fp8_e5m2"), 35_136),
        ("kimi-k2.5", ("--tp", "8"), 70_272),
        ("kimi-k2.5", ("--tp", "2"), 70_272),
        ("qwen3-235b-a22b", ("--tp", "8"), 48_128),
        ("qwen3-235b-a22b", ("--tp", "4"), 48_128),
        ("qwen3-235b-a22b", ("--tp", "1"), 192_512),
        ("deepseek-v3.2", ("--tp", "8"), 70_272),
        ("deepseek-v3.2", ("--tp", "8", "--kv-cache-dtype", "fp8_e4m3"), 40_016),
    ],
)
def test_bytes_per_token_per_rank_matches_the_reference_table(name, args, expected):
    assert bytes_per_token_per_rank(model(name), plan(*args)) == expected


def test_qwen3_moe_keeps_one_replicated_kv_head_per_rank_at_tp8():
    assert kv_heads_per_rank(model("qwen3-235b-a22b"), plan("--tp", "8")) == 1


def test_mla_is_the_same_on_every_rank_whatever_the_tp():
    cells = {bytes_per_token_per_rank(model("kimi-k2.5"), plan("--tp", str(tp))) for tp in (1, 8)}
    assert cells == {70_272}


def test_dsa_indexer_adds_132_bytes_per_layer_and_is_zero_elsewhere():
    assert indexer_bytes_per_token_per_rank(model("deepseek-v3.2"), plan("--tp", "8")) == 8_052
    assert indexer_bytes_per_token_per_rank(model("deepseek-v3"), plan("--tp", "8")) == 0
    assert indexer_bytes_per_token_per_rank(model("llama-3-70b"), plan("--tp", "8")) == 0


def test_mtp_draft_layers_are_packed_only_with_speculative_decoding():
    config = model("deepseek-v3")  # one NextN layer
    assert layers_per_rank(config, plan("--tp", "8")) == 61
    spec = plan("--tp", "8", "--speculative-algorithm", "EAGLE")
    assert layers_per_rank(config, spec) == 62
    assert bytes_per_token_per_rank(config, spec) == 576 * 2 * 62


def test_a_separate_draft_model_adds_no_layers_to_the_target_pool():
    spec = plan("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "other/d")
    assert layers_per_rank(model("deepseek-v3"), spec) == 61


def test_pipeline_stage_holds_its_share_of_layers_rounded_up():
    assert layers_per_rank(model("deepseek-v3"), plan("--tp", "4", "--pp-size", "2")) == 31


def test_dp_attention_splits_kv_heads_over_the_attention_tp_only():
    dp_attn = plan("--tp", "8", "--dp", "8", "--enable-dp-attention")
    assert kv_heads_per_rank(model("llama-3-70b"), dp_attn) == 8


@pytest.mark.parametrize("tp", ["1", "2", "4", "8", "16", "32", "64"])
def test_a_tp_that_splits_the_heads_evenly_is_no_problem(tp):
    assert tp_split_problem(model("llama-3-70b"), plan("--tp", tp)) is None


@pytest.mark.parametrize(
    ("config", "args", "message"),
    [
        ("llama-3-70b", ("--tp", "3"), "--tp-size 3 does not divide the 64 attention heads"),
        ("llama-3-70b", ("--tp", "6"), "--tp-size 6 does not divide the 64 attention heads"),
        (
            {"num_attention_heads": 48, "num_key_value_heads": 12},
            ("--tp", "8"),
            "--tp-size 8 does not divide the 12 KV heads",
        ),
        (
            {"num_attention_heads": 48, "num_key_value_heads": 16},
            ("--tp", "24"),
            "--tp-size 24 is not a multiple of the 16 KV heads",
        ),
        ("kimi-k2.5", ("--tp", "3"), "--tp-size 3 does not divide the 64 attention heads"),
    ],
)
def test_a_tp_sglang_cannot_split_the_heads_over_is_named(config, args, message):
    """SGLang asserts these when it builds the attention layers, after the load has begun."""
    geometry = model(config) if isinstance(config, str) else config
    problem = tp_split_problem(geometry, plan(*args))
    assert problem is not None
    assert message in problem


def test_the_split_is_over_the_attention_tp_with_dp_attention():
    # 8 ranks as 4 attention-DP groups of TP 2: each group splits 48 heads / 12 KV heads in two.
    dp_attn = plan("--tp", "8", "--dp", "4", "--enable-dp-attention")
    assert tp_split_problem({"num_attention_heads": 48, "num_key_value_heads": 12}, dp_attn) is None
    assert tp_split_problem(model("kimi-k2.5"), dp_attn) is None


def test_mla_checks_only_the_attention_heads():
    assert tp_split_problem(model("deepseek-v3"), plan("--tp", "16")) is None
    assert tp_split_problem({"kv_lora_rank": 512, "num_attention_heads": 128}, plan("--tp", "3"))


def test_a_config_without_heads_leaves_the_split_to_the_kv_arithmetic():
    assert tp_split_problem({"num_hidden_layers": 2}, plan("--tp", "3")) is None


def test_auto_kv_dtype_follows_the_model_unless_the_checkpoint_declares_fp8():
    config = model("llama-3-70b")
    assert kv_cache_dtype(config, plan()) == "bfloat16"
    fp8 = {**config, "quantization_config": {"kv_cache_quant_algo": "FP8"}}
    assert kv_cache_dtype(fp8, plan()) == "fp8_e4m3"
    assert bytes_per_token_per_rank(fp8, plan("--tp", "8")) == 20_480
    # An FP8 *weight* checkpoint (DeepSeek-V3) keeps a bf16 KV cache.
    assert kv_cache_dtype(model("deepseek-v3"), plan()) == "bfloat16"


def test_head_dim_falls_back_to_hidden_over_heads_and_v_head_dim_is_honoured():
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}
    assert bytes_per_token_per_rank(config, plan()) == (64 + 64) * 4 * 2 * 2
    config_v = {**config, "num_key_value_heads": 2, "head_dim": 32, "v_head_dim": 16}
    assert bytes_per_token_per_rank(config_v, plan()) == (32 + 16) * 2 * 2 * 2


def test_chatglm_style_multi_query_group_num_counts_as_kv_heads():
    config = {"num_layers": 1, "num_attention_heads": 32, "hidden_size": 4096}
    config["multi_query_group_num"] = 2
    assert bytes_per_token_per_rank(config, plan()) == (128 + 128) * 2 * 2


def test_block_scaled_fp4_rounds_up_to_whole_bytes():
    config = {"num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 3, "hidden_size": 3}
    # 6 elements × 4.5 bits = 27 bits -> 4 bytes.
    assert bytes_per_token_per_rank(config, plan("--kv-cache-dtype", "nvfp4")) == 4


def test_block_scaled_fp8_counts_its_scale_exactly():
    # 128 elements × (8 + 8/32) bits = 1056 bits = 132 bytes: exact, no rounding either way.
    config = {"num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 64, "hidden_size": 64}
    assert bytes_per_token_per_rank(config, plan("--kv-cache-dtype", "mxfp8")) == 132
    config["num_hidden_layers"] = 3  # 3168 bits: 396 bytes
    assert bytes_per_token_per_rank(config, plan("--kv-cache-dtype", "mxfp8")) == 396


def test_attention_kind_names_the_pool_layout():
    assert attention_kind(model("deepseek-v3.2")) == "dsa"
    assert attention_kind(model("kimi-k2.5")) == "mla"
    assert attention_kind(model("llama-3-70b")) == "mha"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_attention_heads": 8, "hidden_size": 512}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "hidden_size": 512}, "num_attention_heads"),
        (
            {"num_hidden_layers": "two", "num_attention_heads": 8, "head_dim": 8},
            "num_hidden_layers",
        ),
        ({"num_hidden_layers": 2, "num_attention_heads": 8}, "hidden_size"),
        ({"num_hidden_layers": 2, "kv_lora_rank": 512}, "qk_rope_head_dim"),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 8, "torch_dtype": "x"},
            "unknown KV dtype",
        ),
        ({"num_hidden_layers": 0, "num_attention_heads": 8, "head_dim": 8}, "0 bytes of KV"),
        ({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 0}, "0 bytes of KV"),
    ],
)
def test_incomplete_or_wrong_configs_name_the_key(config, message):
    with pytest.raises(GeometryError, match=message):
        bytes_per_token_per_rank(config, plan())
