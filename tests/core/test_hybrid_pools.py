"""A hybrid model's pools, pinned to numbers worked by hand from SGLang 0.5.23's code (paths under
sglang/srt/) for GPT-OSS-120B, Qwen3-Next-80B-A3B and Gemma-3-27B at TP 8 on an H200.

The budget every case shares: an H200 (143,771 MiB) less the 2 GiB CUDA context is F =
148,607,336,448 B; at --mem-fraction-static 0.85, int(F × 0.85) = 126,316,235,980 B, less the
rank's weights (mem_cache/kv_cache_configurator.py:2990-3060 `_profile_available_bytes`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.core import fit, hybrid_geometry, hybrid_host, pools
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.model_geometry import GeometryError
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GB

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
F_TIMES_M = 126_316_235_980  # int(148,607,336,448 × 0.85)


def config(name: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    text = raw.pop("text_config", None)
    return raw | (text or {})


def plan(*argv: str) -> Any:
    return parse_launch_args(["--model-path", "m", "--tp", "8", *argv])


def layout(name: str, *argv: str) -> HybridLayout:
    found = hybrid_geometry.hybrid_layout(config(name), plan(*argv), {})
    assert found is not None
    return found


def test_gpt_oss_has_a_full_and_a_sliding_window_pool_of_18_layers_each():
    # layer_types alternates sliding/full (config.json), GptOssForCausalLM is in SWA_SINK_ARCHS
    # (configs/model_config.py:88-96); a row is (64 + 64) × max(1, 8 // 8) heads × 2 B a layer.
    got = layout("gpt-oss-120b")
    assert (got.kind, got.full_layers, got.swa_layers) == ("swa", 18, 18)
    assert (got.full_row_bytes, got.swa_row_bytes, got.window_tokens) == (4_608, 4_608, 128)


def test_qwen3_next_has_12_attention_layers_and_36_of_mamba_state():
    # Every 4th layer is attention (configs/qwen3_next.py:260-268). A state slot per layer and
    # rank (configs/mamba_utils.py:195-240): conv (32·128 + 2·16·128) / 8 × (4 − 1) = 3,072 bf16
    # = 6,144 B; SSM 32/8 × 128 × 128 = 65,536 float32 = 262,144 B; × 36 layers = 9,658,368 B.
    got = layout("qwen3-next-80b-a3b")
    assert (got.kind, got.full_layers, got.mamba_layers) == ("mamba", 12, 36)
    assert got.full_row_bytes == 12 * (256 + 256) * 1 * 2 == 12_288
    assert got.mamba_slot_bytes == (6_144 + 262_144) * 36 == 9_658_368


def test_the_ssm_dtype_follows_the_flag_over_the_variable_over_the_config():
    qwen = config("qwen3-next-80b-a3b") | {"mamba_ssm_dtype": "bfloat16"}
    half = (6_144 + 131_072) * 36
    assert hybrid_geometry.hybrid_layout(qwen, plan(), {}).mamba_slot_bytes == half  # type: ignore[union-attr]
    env = {"SGLANG_MAMBA_SSM_DTYPE": "float32"}
    assert hybrid_geometry.hybrid_layout(qwen, plan(), env).mamba_slot_bytes == 9_658_368  # type: ignore[union-attr]
    flagged = plan("--mamba-ssm-dtype", "bfloat16")
    assert hybrid_geometry.hybrid_layout(qwen, flagged, env).mamba_slot_bytes == half  # type: ignore[union-attr]


def test_gemma_3_keeps_one_pool_of_all_layers_as_sglang_does():
    # arg_groups/model_overrides/gemma2_gemma3.py:13-26 turns hybrid SWA memory off for Gemma-3:
    # the "SWA pool for Gemma-3" is not what 0.5.23 builds.
    assert hybrid_geometry.hybrid_layout(config("gemma-3-27b"), plan(), {}) is None
    # and --disable-hybrid-swa-memory does the same for GPT-OSS
    gpt = config("gpt-oss-120b")
    assert hybrid_geometry.hybrid_layout(gpt, plan("--disable-hybrid-swa-memory"), {}) is None


def test_gpt_oss_device_pools_share_one_budget_with_the_swa_pool_at_0_8():
    # W = 65 GB / 8. Cell = 4,608 + 0.8 × 4,608 = 8,294.4 B (pool_configurator.py:786-803);
    # full = int(118,191,235,980 // 8,294.4) = 14,249,522; SWA = int(14,249,522 × 0.8) =
    # 11,399,617 (:880-881, the 0.8 of arg_groups/fields/schedule.py:150-161).
    budget = F_TIMES_M - 8_125_000_000
    full, swa = pools.device_pools(layout("gpt-oss-120b"), plan(), budget)
    assert (full.name, full.device, full.device_bytes) == ("full", 14_249_522, 65_661_801_984)
    assert (swa.name, swa.device, swa.device_bytes) == ("swa", 11_399_617, 52_529_439_744)


def test_a_smaller_swa_ratio_and_a_token_cap_reshape_the_pools():
    gpt = layout("gpt-oss-120b")
    budget = F_TIMES_M - 8_125_000_000
    full, swa = pools.device_pools(gpt, plan("--swa-full-tokens-ratio", "0.5"), budget)
    assert (full.device, swa.device) == (17_099_426, 8_549_713)  # 118,191,235,980 // 6,912
    full, swa = pools.device_pools(gpt, plan("--max-total-tokens", "1000000"), budget)
    assert (full.device, swa.device) == (1_000_000, 800_000)


def test_qwen3_next_gives_0_9_over_1_9_of_the_budget_to_mamba_slots():
    # W = 160 GB / 8; budget 106,316,235,980 B. Mamba share × 0.9 / 1.9, K = int((share − slot)
    # // slot) = 5,213 (kv_cache_configurator.py:3348-3386), K + 1 slots taken (:3404-3410);
    # (106,316,235,980 − 5,214 × 9,658,368) // 12,288 = 4,553,833 tokens (pool_configurator.py:
    # 637-647, the cell of the 12 attention layers only, :228-236).
    budget = F_TIMES_M - 20_000_000_000
    mamba, kv = pools.device_pools(layout("qwen3-next-80b-a3b"), plan(), budget)
    assert (mamba.name, mamba.device, mamba.device_bytes) == ("mamba", 5_213, 50_358_730_752)
    assert (kv.name, kv.device, kv.device_bytes) == ("kv", 4_553_833, 55_957_512_192)
    mamba, _kv = pools.device_pools(
        layout("qwen3-next-80b-a3b"), plan("--max-mamba-cache-size", "1000"), budget
    )
    assert mamba.device == 1_000


def test_ratio_mode_mirrors_each_device_pool_with_a_padding_row():
    # pool_host/base.py:221-229: int(device × R), then whole pages + 1; pool_host/mamba.py:164-174:
    # int(slots × R) + 1.
    gpt = pools.device_pools(layout("gpt-oss-120b"), plan(), F_TIMES_M - 8_125_000_000)
    sized = pools.host_pools(plan("--enable-hicache", "--hicache-ratio", "2"), gpt, 2.0)
    assert [(p.host, p.host_bytes) for p in sized] == [
        (28_499_045, 131_323_599_360),
        (22_799_235, 105_058_874_880),
    ]
    qwen = pools.device_pools(layout("qwen3-next-80b-a3b"), plan(), F_TIMES_M - 20_000_000_000)
    sized = pools.host_pools(plan("--enable-hicache", "--hicache-ratio", "2"), qwen, 2.0)
    assert [(p.name, p.host, p.host_bytes) for p in sized] == [
        ("mamba", 10_427, 100_707_803_136),
        ("kv", 9_107_667, 111_915_012_096),
    ]


def test_size_mode_splits_the_gigabytes_by_device_bytes():
    # hybrid_pool_assembler.py:239-254: 100 × 65,661,801,984 / 118,191,241,728 = 55.5555564 GB
    # for the full pool: int(55.5555564e9 // 4,608) + 1 = 12,056,328 tokens; the SWA pool
    # 44.4444436 GB: 9,645,062 tokens. Together 100,000,005,120 B: the padding rows.
    argv = ("--enable-hicache", "--hicache-size", "100")
    gpt = pools.device_pools(layout("gpt-oss-120b"), plan(), F_TIMES_M - 8_125_000_000)
    sized = pools.host_pools(plan(*argv), gpt, 0.0)
    assert [(p.host, p.host_bytes) for p in sized] == [
        (12_056_328, 55_555_559_424),
        (9_645_062, 44_444_445_696),
    ]
    assert pools.host_bytes_at_size(plan(*argv), gpt, 100) == 100_000_005_120
    # :1318-1322 for Mamba: 47.3669209 GB / 9,658,368 B = 4,904 slots + 1; the KV pool
    # 52.6330791 GB / 12,288 B = 4,283,290 + 1 page.
    qwen = pools.device_pools(layout("qwen3-next-80b-a3b"), plan(), F_TIMES_M - 20_000_000_000)
    sized = pools.host_pools(plan(*argv), qwen, 0.0)
    assert [(p.name, p.host, p.host_bytes) for p in sized] == [
        ("mamba", 4_905, 47_374_295_040),
        ("kv", 4_283_291, 52_633_079_808),
    ]


def test_sglang_s_own_refusals_of_a_pool_too_small():
    gpt = layout("gpt-oss-120b")
    tiny = pools.device_pools(gpt, plan(), 1_000_000)  # 120 full tokens, 96 SWA: window 128
    assert "cannot hold one request of the 128-token window" in (
        pools.device_problem(gpt, plan(), tiny) or ""
    )
    qwen = layout("qwen3-next-80b-a3b")
    none_left = pools.device_pools(qwen, plan(), 10_000_000)  # less than two slots
    assert "no GPU memory is left for the Mamba state" in (
        pools.device_problem(qwen, plan(), none_left) or ""
    )
    assert pools.device_problem(gpt, plan(), pools.device_pools(gpt, plan(), 10**11)) is None


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        (
            "gpt-oss-120b",
            {"layer_types": ["full_attention"] * 35},
            "config key layer_types has 35 entries, num_hidden_layers is 36",
        ),
        ("gpt-oss-120b", {"sliding_window": 0}, "config key sliding_window must be a positive"),
        ("gpt-oss-120b", {"sliding_window": -128}, "config key sliding_window must be a positive"),
        ("gpt-oss-120b", {"sliding_window": None}, "config lacks sliding_window"),
        (
            "gpt-oss-120b",
            {"layer_types": ["sliding_attention", "chunked"] * 18},
            "config key layer_types[1] is 'chunked'",
        ),
        ("qwen3-next-80b-a3b", {"linear_key_head_dim": None}, "config lacks linear_key_head_dim"),
        (
            "qwen3-next-80b-a3b",
            {"linear_conv_kernel_dim": 0},
            "config key linear_conv_kernel_dim must be a positive integer",
        ),
        ("qwen3-next-80b-a3b", {"full_attention_interval": None}, "full_attention_interval"),
    ],
)
def test_a_hybrid_config_that_cannot_be_sized_names_its_key(name, change, message):
    broken = {k: v for k, v in (config(name) | change).items() if v is not None}
    with pytest.raises(GeometryError, match=message.replace("[", r"\[").replace("]", r"\]")):
        hybrid_geometry.hybrid_layout(broken, plan(), {})


def test_nemotron_h_counts_only_its_mamba_and_attention_layers():
    nemotron = {
        "architectures": ["NemotronHForCausalLM"],
        "hybrid_override_pattern": "M-M*-M-M*-",
        "num_hidden_layers": 10,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
    }
    got = hybrid_geometry.hybrid_layout(nemotron, plan(), {})
    assert got is not None
    assert (got.full_layers, got.mamba_layers) == (2, 4)
    # conv (128·64 + 2·8·128) / 8 × 3 = 3,840 bf16; SSM 16 × 64 × 128 float32 = 524,288 B
    assert got.mamba_slot_bytes == (3_840 * 2 + 524_288) * 4
    assert got.full_row_bytes == 2 * 256 * 1 * 2


def test_pipeline_stages_hold_the_largest_stage_s_layers():
    # distributed/utils.py:110-150: 36 layers over PP 5 = 7, 7, 7, 7, 8 (the remainder last).
    assert [len(r) for r in hybrid_geometry.stage_layers(36, 5)] == [7, 7, 7, 7, 8]
    got = layout("gpt-oss-120b", "--pp-size", "4")
    assert (got.full_layers, got.swa_layers) == (5, 5)  # 9 layers a stage, alternating


def test_the_safe_size_is_the_largest_whose_split_fits():
    gpt_oss = layout("gpt-oss-120b")
    argv = plan("--enable-hicache", "--hicache-size", "100")
    device = pools.device_pools(gpt_oss, argv, F_TIMES_M - 8_125_000_000)
    budget = fit.HostBudget(
        usable_bytes=2000 * GB,
        reserve_bytes=10 * GB,
        per_rank_overhead_bytes=4 * GB,
        main_overhead_bytes=6 * GB,
    )
    safe, bought = hybrid_host.safe_size(argv, gpt_oss, device, budget, ())
    # 8 ranks × the split of `safe` GB fit beside 8 × 4 + 6 GB; one GB more does not.
    need = [8 * pools.host_bytes_at_size(argv, device, s) + 38 * GB for s in (safe, safe + 1)]
    assert need[0] <= budget.budget_bytes < need[1]
    assert safe == 243  # (2,000 − 10 − 38) / 8 = 244 GB, and the padding rows tip 244 over
    shares = pools.size_shares_gb(safe, device)
    assert bought == int(shares[0] * 1e9 // 4_608) + 1
