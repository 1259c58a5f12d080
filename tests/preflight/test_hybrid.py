"""The pre-flight of hybrid models on 8×H200 at TP 8: each pool's device and host tokens and bytes
equal numbers worked by hand from SGLang 0.5.23's code (tests/core/test_hybrid_pools.py shows
the working), estimated before a first run and read from SGLang's own log lines after it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import HostConfig, SupervisorConfig
from supervisor.core.measured import Record, SizingLog, device_settings
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GB, GiB, MiB
from supervisor.preflight import run_preflight
from supervisor.preflight.measurements import FILE_NAME, load_records, save_record
from tests.preflight.support import ROOT, run, run_json

MODELS = ROOT / "configs" / "models"
H200 = 143_771 * MiB
FACTS = ["--mem-available", "2000GB", "--gpus", "8", "--gpu-memory", "143771MiB"]
FACTS += ["--sglang-version", "0.5.23"]
GPT_OSS = ["--model-path", "openai/gpt-oss-120b", "--tp", "8", "--mem-fraction-static", "0.85"]
QWEN_NEXT = ["--model-path", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--tp", "8"]
QWEN_NEXT += ["--mem-fraction-static", "0.85"]
GEMMA = ["--model-path", "google/gemma-3-27b-it", "--tp", "8", "--mem-fraction-static", "0.85"]
RATIO = ["--enable-hierarchical-cache", "--hicache-ratio", "2"]
SIZE = ["--enable-hierarchical-cache", "--hicache-size", "100"]


def model(name: str, weights: str) -> list[str]:
    return [*FACTS, "--weights", weights, "--model-config", str(MODELS / name / "config.json")]


def pools(listed: Any) -> list[tuple[Any, ...]]:
    keys = ("pool", "device", "device_bytes", "host", "host_bytes")
    return [tuple(p[k] for k in keys) for p in listed]


# (the model's facts, argv, each pool: name, device, device bytes, host, host bytes)
CASES: dict[str, tuple[list[str], list[str], list[tuple[Any, ...]]]] = {
    "gpt-oss ratio": (
        model("gpt-oss-120b", "65GB"),
        [*GPT_OSS, *RATIO],
        [
            ("full", 14_249_522, 65_661_801_984, 28_499_045, 131_323_599_360),
            ("swa", 11_399_617, 52_529_439_744, 22_799_235, 105_058_874_880),
        ],
    ),
    "gpt-oss size": (
        model("gpt-oss-120b", "65GB"),
        [*GPT_OSS, *SIZE],
        [
            ("full", 14_249_522, 65_661_801_984, 12_056_328, 55_555_559_424),
            ("swa", 11_399_617, 52_529_439_744, 9_645_062, 44_444_445_696),
        ],
    ),
    "qwen3-next ratio": (
        model("qwen3-next-80b-a3b", "160GB"),
        [*QWEN_NEXT, *RATIO],
        [
            ("mamba", 5_213, 50_358_730_752, 10_427, 100_707_803_136),
            ("kv", 4_553_833, 55_957_512_192, 9_107_667, 111_915_012_096),
        ],
    ),
    "qwen3-next size": (
        model("qwen3-next-80b-a3b", "160GB"),
        [*QWEN_NEXT, *SIZE],
        [
            ("mamba", 5_213, 50_358_730_752, 4_905, 47_374_295_040),
            ("kv", 4_553_833, 55_957_512_192, 4_283_291, 52_633_079_808),
        ],
    ),
    # Gemma-3 keeps one pool of all 62 layers (arg_groups/model_overrides/gemma2_gemma3.py:13-26):
    # a row of 62 × (128 + 128) × 16/8 heads × 2 B = 63,488 B; the budget 126,316,235,980 −
    # 55 GB / 8 − the 100 MiB multimodal reserve (kv_cache_configurator.py:202-219) =
    # 119,336,378,380 B // 63,488 = 1,879,668 tokens, (1,879,668 + 1) rows on the GPU; host
    # int(× 2) + 1, or 100e9 // 63,488 + 1.
    "gemma-3 ratio": (
        model("gemma-3-27b", "55GB"),
        [*GEMMA, *RATIO],
        [("kv", 1_879_668, 119_336_425_472, 3_759_337, 238_672_787_456)],
    ),
    "gemma-3 size": (
        model("gemma-3-27b", "55GB"),
        [*GEMMA, *SIZE],
        [("kv", 1_879_668, 119_336_425_472, 1_575_101, 100_000_012_288)],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_pool_on_the_gpu_and_in_host_memory(capsys, case):
    facts, argv, expected = CASES[case]
    code, data = run_json(capsys, *facts, "--", *argv)
    assert code == 0, data["checks"]
    assert pools(data["pools"]) == expected
    # The totals are the pools': what the host budget and restart-smaller work with.
    assert data["host_pool_bytes_per_rank"] == sum(p[4] for p in expected)
    anchor = next(p for p in expected if p[0] in ("full", "kv"))
    assert (data["device_tokens_per_rank"], data["host_pool_tokens_per_rank"]) == anchor[1::2]


def test_the_mamba_host_pool_is_a_consumer_of_its_own(capsys):
    """At ratio 2 Qwen3-Next's state slots take 100.7 GB a rank: counted, a launch that the one
    attention-layer cell planned as 111.9 GB a rank does not fit 1,000 GB."""
    facts, argv, _ = CASES["qwen3-next ratio"]
    facts = [*facts[:1], "1000GB", *facts[2:]]
    code, data = run_json(capsys, *facts, "--", *argv)
    assert code == 1
    host = next(c for c in data["checks"] if c["name"] == "host_memory")
    assert host["status"] == "fail"
    assert data["host_pool_bytes_per_rank"] == 212_622_815_232


def test_the_table_lists_the_pools(capsys):
    facts, argv, _ = CASES["gpt-oss ratio"]
    code, out, _err = run(capsys, "preflight", *facts, "--", *argv)
    assert code == 0
    assert "pools per rank" in out
    assert "full  14,249,522 tokens × 4,608 B = 65.7 GB on the GPU; host 28,499,045" in out
    assert "swa   11,399,617 tokens × 4,608 B = 52.5 GB on the GPU; host 22,799,235" in out


def test_without_gpu_facts_size_mode_is_split_as_the_solve_would(capsys):
    facts = [a for a in FACTS if a not in ("--gpus", "8", "--gpu-memory", "143771MiB")]
    facts += ["--model-config", str(MODELS / "gpt-oss-120b" / "config.json")]
    code, data = run_json(capsys, *facts, "--", *GPT_OSS, *SIZE)
    assert code == 0
    # 100 × 4,608 / (4,608 + 0.8 × 4,608) = 55.5556 GB: the same split within a token
    full, swa = data["pools"]
    assert (full["device"], swa["device"]) == (None, None)
    assert abs(full["host"] - 12_056_328) <= 1
    assert abs(swa["host"] - 9_645_062) <= 1
    code, data = run_json(capsys, *facts, "--", *GPT_OSS, *RATIO)
    assert code == 1
    assert any("cannot size the host pools" in c["detail"] for c in data["checks"])


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"layer_types": ["full_attention"] * 35}, "layer_types has 35 entries"),
        ({"sliding_window": 0}, "sliding_window must be a positive integer"),
        ({"sliding_window": -1}, "sliding_window must be a positive integer"),
    ],
)
def test_a_broken_hybrid_config_exits_2_naming_the_key(capsys, tmp_path, change, key):
    broken = json.loads((MODELS / "gpt-oss-120b" / "config.json").read_text()) | change
    path = tmp_path / "config.json"
    path.write_text(json.dumps(broken))
    code, out, err = run(
        capsys, "preflight", *FACTS, "--model-config", str(path), "--", *GPT_OSS, *RATIO
    )
    assert code == 2
    assert key in err
    assert str(path) in err
    assert "Traceback" not in out + err


def test_a_mamba_config_without_its_state_sizes_exits_2_naming_the_key(capsys, tmp_path):
    broken = json.loads((MODELS / "qwen3-next-80b-a3b" / "config.json").read_text())
    del broken["linear_num_value_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(broken))
    code, out, err = run(
        capsys, "preflight", *FACTS, "--model-config", str(path), "--", *QWEN_NEXT, *RATIO
    )
    assert code == 2
    assert "config lacks linear_num_value_heads" in err
    assert "Traceback" not in out + err


# ---- after a first run: SGLang's own lines, composed from its format strings ----------------

PREFIX = "[2026-12-01 05:00:00 TP{rank}] "


def _kv_line(label: str, tokens: int, row_per_layer: int, layers: int) -> str:
    """mem_cache/memory_pool.py:2073-2099 `_finalize_allocation_log` (GB = 1 << 30): K and V
    each hold (size + page) rows of every layer (`_kv_buffer_shapes`, :2567-2578)."""
    half = (tokens + 1) * row_per_layer // 2 * layers
    return (
        f"{label}KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, "
        f"K size: {half / GiB:.2f} GB, V size: {half / GiB:.2f} GB"
    )


def gpt_oss_lines(rank: int) -> list[str]:
    """What one GPT-OSS rank logs: model_runner.py:1372-1379, the two KV pools (full first:
    mem_cache/swa_memory_pool.py:76-107), swa_memory_pool.py:130-134,
    kv_cache_configurator.py:498-501, then the host pools (pool_host/base.py:272-278, labels of
    hybrid_pool_assembler.py:418-433)."""
    lines = [
        "Load weight end. elapsed=41.20 s, type=GptOssForCausalLM, quant=mxfp4, "
        "avail mem=130.84 GB, mem usage=7.57 GB.",
        _kv_line("Full ", 14_249_522, 256, 18),
        _kv_line("SWA ", 11_399_617, 256, 18),
        "SWAKVPool mem usage: 110.07 GB, swa size: 11399617, full size: 14249522",
        "Memory pool end. avail mem=20.72 GB",
        "Allocating full hierarchical KV host pool: 28499045 tokens, 131.32 GB host memory.",
        "Allocating swa hierarchical KV host pool: 22799235 tokens, 105.06 GB host memory.",
    ]
    return [PREFIX.format(rank=rank) + line for line in lines]


def qwen_next_lines(rank: int) -> list[str]:
    """One Qwen3-Next rank: the Mamba pool before the KV pool (the request pool is built
    first, kv_cache_configurator.py:744-781), memory_pool.py:1004-1009, then the host pools
    (hybrid_pool_assembler.py:1331-1353; pool_host/mamba.py:192-197)."""
    lines = [
        "Load weight end. elapsed=63.02 s, type=Qwen3NextForCausalLM, "
        "avail mem=119.76 GB, mem usage=18.63 GB.",
        "Mamba Cache is allocated. max_mamba_cache_size: 5213, conv_state size: 1.10GB, "
        "ssm_state size: 46.80GB ",
        _kv_line("", 4_553_833, 1_024, 12),
        "Memory pool end. avail mem=20.83 GB",
        "Allocating kv hierarchical KV host pool: 9107667 tokens, 111.92 GB host memory.",
        "Allocating 100.71 GB host memory for hierarchical Mamba cache (10427 state slots, "
        "layout=page_first).",
    ]
    return [PREFIX.format(rank=rank) + line for line in lines]


def planning_config(tmp_path: Path, name: str, weights: int) -> SupervisorConfig:
    base = SupervisorConfig()
    server = dataclasses.replace(base.server, model_config=str(MODELS / name / "config.json"))
    pre = dataclasses.replace(base.preflight, weights_bytes=weights)
    host = HostConfig(
        mem_available_bytes=2000 * GB, gpus=8, gpu_memory_bytes=H200, sglang_version="0.5.23"
    )
    run_ = dataclasses.replace(base.run, state_dir=str(tmp_path / "state"))
    (tmp_path / "state").mkdir(exist_ok=True)
    return dataclasses.replace(base, server=server, preflight=pre, host=host, run=run_)


@pytest.mark.parametrize(
    ("case", "name", "weights", "lines"),
    [
        ("gpt-oss ratio", "gpt-oss-120b", 65 * GB, gpt_oss_lines),
        ("qwen3-next ratio", "qwen3-next-80b-a3b", 160 * GB, qwen_next_lines),
    ],
)
def test_sglang_s_log_lines_give_the_same_pools(tmp_path, case, name, weights, lines):
    _facts, argv, expected = CASES[case]
    config = planning_config(tmp_path, name, weights)
    first = run_preflight(config, argv)
    assert [next(iter(p.values())) for p in first.pools] == [p[0] for p in expected]
    log = SizingLog()
    for rank in range(8):
        for line in lines(rank):
            log.feed(line)
    measured = log.measurement()
    names = {p[0]: p[1] for p in expected}
    assert dict(measured.device_pools or {}) == names
    assert measured.device_tokens == next(v for k, v in names.items() if k in ("full", "kv"))
    assert first.deployment is not None
    settings = device_settings(parse_launch_args(argv))
    save_record(
        config.run.state_path,
        Record(deployment=first.deployment, settings=settings, measurement=measured, at=1.0),
    )
    again = run_preflight(config, argv)
    assert again.device_tokens_source == "measured"
    assert pools(again.pools) == expected
    assert again.host_pool_bytes_per_rank == first.host_pool_bytes_per_rank


def test_the_measured_host_pools_are_read_per_label():
    log = SizingLog()
    for line in qwen_next_lines(0) + gpt_oss_lines(1):
        log.feed(line)
    got = log.measurement()
    assert got.host_pools == {
        "full": 28_499_045,
        "kv": 9_107_667,
        "mamba": 10_427,
        "swa": 22_799_235,
    }


def test_an_older_record_of_a_hybrid_model_lends_its_memory_not_its_tokens(tmp_path):
    """Before the pools were read apart a record of GPT-OSS kept the last KV line's tokens, the
    SWA pool's; it is still read, its free memory and weights used, its tokens not."""
    _facts, argv, expected = CASES["gpt-oss ratio"]
    config = planning_config(tmp_path, "gpt-oss-120b", 65 * GB)
    first = run_preflight(config, argv)
    assert first.deployment is not None
    old = {
        "deployment": dataclasses.asdict(first.deployment),
        "settings": device_settings(parse_launch_args(argv)),
        "measurement": {
            "pre_load_free_bytes": int((130.84 + 7.57) * GiB),
            "weights_bytes": int(7.57 * GiB),
            "device_tokens": 11_399_617,
            "host_pool_tokens": 51_298_280,
            "free_after_pools_bytes": int(20.72 * GiB),
            "device": "gpu",
        },
        "at": 1.0,
    }
    (config.run.state_path / FILE_NAME).write_text(json.dumps({"version": 1, "records": [old]}))
    records, problem = load_records(config.run.state_path)
    assert problem is None
    assert records[0].measurement.device_pools is None
    again = run_preflight(config, argv)
    assert again.device_tokens_source == "estimate"
    assert again.weights_per_rank_bytes == int(7.57 * GiB)
    full = again.pools[0]
    assert full["pool"] == "full"
    assert full["device"] != 11_399_617
    device = full["device"]
    assert isinstance(device, int)
    assert abs(device - expected[0][1]) / expected[0][1] < 0.01
