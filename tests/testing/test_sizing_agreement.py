"""The pre-flight (supervisor/core) and the simulation (supervisor/testing/sizing.py) are two
independent transcriptions of SGLang's sizing code. Both are pinned here to the same literal
numbers, most of them SGLang's own (its HostKVCache class run on CPU gives 683,061 tokens =
48,000,062,592 B for Kimi-K2 at --hicache-size 48), so neither can drift unseen."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core import fit, model_geometry
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GiB, MiB
from supervisor.testing import sizing
from supervisor.testing.args import parse_sim_args

LLAMA_70B: dict[str, Any] = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}
KIMI_K2: dict[str, Any] = {
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}
QWEN3_235B: dict[str, Any] = {
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


def _both(argv: list[str]) -> tuple[Any, Any]:
    full = ["--model-path", "m", *argv]
    return parse_launch_args(full), parse_sim_args(full)


@pytest.mark.parametrize(
    ("config", "argv", "cell"),
    [
        (LLAMA_70B, ["--tp", "8"], 40_960),
        (LLAMA_70B, ["--tp", "1"], 327_680),
        (LLAMA_70B, ["--tp", "8", "--kv-cache-dtype", "fp8_e4m3"], 20_480),
        (KIMI_K2, ["--tp", "8"], 70_272),
        (KIMI_K2, ["--tp", "2"], 70_272),
        (QWEN3_235B, ["--tp", "8"], 48_128),
    ],
)
def test_kv_bytes_per_token_per_rank(config: dict[str, Any], argv: list[str], cell: int):
    plan, sim = _both(argv)
    assert model_geometry.bytes_per_token_per_rank(config, plan) == cell
    assert sizing.geometry(config, sim).size_per_token == cell


@pytest.mark.parametrize(
    ("argv", "cell", "device_tokens", "host_tokens"),
    [
        # SGLang's own HostKVCache: --hicache-size 48 for Kimi-K2 = 683,061 tokens.
        (["--enable-hicache", "--hicache-size", "48"], 70_272, None, 683_061),
        (["--enable-hicache", "--hicache-size", "40", "--page-size", "64"], 163_840, None, 244_160),
        (["--enable-hicache", "--hicache-ratio", "1.5"], 40_960, 1_000_000, 1_500_001),
        (["--enable-hicache"], 40_960, 1_000_000, 2_000_001),
        (
            ["--enable-hicache", "--hicache-host-memory-mode", "buffer_only"],
            40_960,
            1_000_000,
            1_200_001,
        ),
    ],
)
def test_host_pool_tokens(argv: list[str], cell: int, device_tokens: int | None, host_tokens: int):
    plan, sim = _both(argv)
    assert fit.host_pool_tokens(plan, cell, device_tokens) == host_tokens
    assert sizing.host_pool_tokens(sim, cell, device_tokens or 0) == host_tokens


def test_the_kimi_pool_is_48_000_062_592_bytes_per_rank():
    assert 683_061 * 70_272 == 48_000_062_592
    plan, sim = _both(["--enable-hicache", "--hicache-size", "48"])
    assert fit.host_pool_bytes_per_rank(plan, 70_272, None) == 48_000_062_592
    assert sizing.host_pool_tokens(sim, 70_272, 0) * 70_272 == 48_000_062_592


@pytest.mark.parametrize(
    ("gpu_mib", "mla", "argv", "fraction"),
    [
        (143_771, False, ["--tp", "8"], 0.893),  # H200
        (143_771, True, ["--tp", "8"], 0.886),
        (81_559, False, ["--tp", "8"], 0.812),  # H100 80 GB
        (81_559, True, ["--tp", "8"], 0.799),
        (97_887, False, ["--tp", "8"], 0.844),  # RTX PRO 6000 Blackwell
        # A 24 GiB card: chunk 4096, so 50 prefill graphs, not the 58 of a chunk of 8192.
        (24_576, False, ["--tp", "1"], 0.704),
        (183_359, False, ["--tp", "8"], 0.849),  # B200: chunk 16384, 74 prefill graphs
    ],
)
def test_automatic_mem_fraction_static(gpu_mib: int, mla: bool, argv: list[str], fraction: float):
    plan, sim = _both(argv)
    assert fit.auto_mem_fraction_static(gpu_mib * MiB, plan, mla=mla) == fraction
    assert sizing.mem_fraction_static(gpu_mib * MiB, sim, mla=mla) == fraction


def test_device_tokens_from_free_memory_weights_and_the_fraction():
    free, weights, cell = 140 * GiB, 70 * GiB, 163_840
    # (140 GiB × 0.9 − 70 GiB) = 56 GiB = 60,129,542,144 B // 163,840 B = 367,001 tokens
    assert (
        fit.estimate_device_tokens(
            gpu_free_bytes=free,
            weights_per_rank_bytes=weights,
            mem_fraction_static=0.9,
            bytes_per_token=cell,
            page_size=1,
            max_total_tokens=None,
        )
        == 367_001
    )
    assert (
        sizing.device_tokens(
            free_before_bytes=free,
            weights_bytes=weights,
            mem_fraction=0.9,
            cell_bytes=cell,
            page_size=1,
            max_total_tokens=None,
        )
        == 367_001
    )
