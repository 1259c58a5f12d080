"""The simulation's hybrid pools (supervisor/testing/hybrid.py, its own transcription of SGLang
0.5.23) and the pre-flight's (supervisor/core/pools.py), both pinned to the numbers worked by hand
in tests/core/test_hybrid_pools.py; the simulated ranks print one "KV Cache is allocated" line
per pool in SGLang's order, and the supervisor reads them back as the same pools."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core import hybrid_geometry, pools
from supervisor.core.measured import SizingLog
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GiB, MiB
from supervisor.testing import hybrid, memlog, sizing
from supervisor.testing.args import parse_sim_args
from tests.preflight.support import ROOT
from tests.waiting import wait_until

MODELS = ROOT / "configs" / "models"
FREE = 143_771 * MiB - 2 * GiB  # an H200 less the CUDA context
WEIGHTS = {"gpt-oss-120b": 65 * 10**9 // 8, "qwen3-next-80b-a3b": 160 * 10**9 // 8}
# name, mode: (device, host) of each pool in SGLang's order (tests/core/test_hybrid_pools.py)
EXPECTED: dict[tuple[str, str], list[tuple[int, int]]] = {
    ("gpt-oss-120b", "ratio"): [(14_249_522, 28_499_045), (11_399_617, 22_799_235)],
    ("gpt-oss-120b", "size"): [(14_249_522, 12_056_328), (11_399_617, 9_645_062)],
    ("qwen3-next-80b-a3b", "ratio"): [(5_213, 10_427), (4_553_833, 9_107_667)],
    ("qwen3-next-80b-a3b", "size"): [(5_213, 4_905), (4_553_833, 4_283_291)],
}
MODES = {"ratio": ["--hicache-ratio", "2"], "size": ["--hicache-size", "100"]}


def argv(mode: str) -> list[str]:
    return ["--model-path", "m", "--tp", "8", "--enable-hicache", *MODES[mode]]


def simulated(name: str, mode: str) -> list[hybrid.SimPool]:
    config = sizing.read_model_config(str(MODELS / name))
    args = parse_sim_args(argv(mode))
    rest = sizing.kv_budget_gib(FREE, WEIGHTS[name], 0.85)
    device = hybrid.device_pools(config, args, rest, sizing.kv_itemsize(config, "auto"))
    assert device is not None
    return hybrid.with_host_pools(args, device, 2.0)


def planned(name: str, mode: str) -> tuple[pools.Pool, ...]:
    config = sizing.read_model_config(str(MODELS / name))
    plan = parse_launch_args(argv(mode))
    layout = hybrid_geometry.hybrid_layout(config, plan, {})
    assert layout is not None
    budget = pools.kv_budget_bytes(FREE, WEIGHTS[name], 0.85, 0)
    return pools.host_pools(plan, pools.device_pools(layout, plan, budget), 2.0)


@pytest.mark.parametrize(("name", "mode"), sorted(EXPECTED))
def test_the_simulation_and_the_preflight_size_each_pool_alike(name, mode):
    assert [(p.size, p.host_size) for p in simulated(name, mode)] == EXPECTED[name, mode]
    assert [(p.device, p.host) for p in planned(name, mode)] == EXPECTED[name, mode]
    rows = [(p.row, p.device_bytes) for p in simulated(name, mode)]
    assert rows == [(p.row_bytes, p.device_bytes) for p in planned(name, mode)]


def plan_of(name: str, mode: str) -> memlog.MemoryPlan:
    sim = simulated(name, mode)
    anchor = next(p for p in sim if p.host_label in ("full", "kv"))
    return memlog.MemoryPlan(
        architecture="x",
        quant=None,
        kv_dtype="torch.bfloat16",
        kind="MHA",
        page_size=1,
        device_tokens=anchor.size,
        k_per_token=anchor.k_row,
        v_per_token=anchor.v_row,
        indexer_per_token=0,
        weights_bytes=WEIGHTS[name],
        cuda_context_bytes=0,
        host_tokens=anchor.host_size,
        host_layout="page_first",
        pools=tuple(sim),
    )


def test_a_sliding_window_model_logs_its_full_pool_then_its_swa_pool():
    lines = memlog.kv_allocated_lines(plan_of("gpt-oss-120b", "ratio"))
    # (14,249,522 + 1) rows × 64 × 2 B × 18 layers = 30.58 GiB for K, the same for V
    assert lines == [
        "Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 14249522, "
        "K size: 30.58 GB, V size: 30.58 GB",
        "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 11399617, "
        "K size: 24.46 GB, V size: 24.46 GB",
        "SWAKVPool mem usage: 110.07 GB, swa size: 11399617, full size: 14249522",
    ]
    assert memlog.host_pool_lines(plan_of("gpt-oss-120b", "ratio")) == [
        "Allocating full hierarchical KV host pool: 28499045 tokens, 131.32 GB host memory.",
        "Allocating swa hierarchical KV host pool: 22799235 tokens, 105.06 GB host memory.",
    ]


def test_a_mamba_hybrid_logs_its_state_pool_before_its_kv_pool():
    plan = plan_of("qwen3-next-80b-a3b", "size")
    # conv 5,214 × 6,144 B × 36 = 1.07 GiB; SSM 5,214 × 262,144 B × 36 = 45.83 GiB
    assert memlog.kv_allocated_lines(plan) == [
        "Mamba Cache is allocated. max_mamba_cache_size: 5213, conv_state size: 1.07GB, "
        "ssm_state size: 45.83GB ",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4553833, "
        "K size: 26.06 GB, V size: 26.06 GB",
    ]
    # host pools: the KV pool first, then the Mamba one (hybrid_pool_assembler.py:1331-1353);
    # 100 GB split in two is less than either device pool, which SGLang warns of
    assert memlog.host_pool_lines(plan) == [
        "HiCache kv host pool (4283291 tokens) is smaller than the device pool (4553833 "
        "tokens);L2 cache effectiveness is reduced.Consider increasing --hicache-ratio (or "
        "--hicache-size) for higher L2 cache hit rate.",
        "Allocating kv hierarchical KV host pool: 4283291 tokens, 52.63 GB host memory.",
        "HiCache host KV pool (4905 tokens) is smaller than the device pool (5213 tokens);"
        "L2 cache effectiveness is reduced.Consider increasing --hicache-ratio (or "
        "--hicache-size) for higher L2 cache hit rate.",
        "Allocating 47.37 GB host memory for hierarchical Mamba cache (4905 state slots, "
        "layout=page_first).",
    ]


@pytest.mark.parametrize(("name", "mode"), sorted(EXPECTED))
def test_the_supervisor_reads_the_simulated_lines_back_as_the_same_pools(name, mode):
    plan = plan_of(name, mode)
    log = SizingLog()
    for line in [
        *memlog.kv_allocated_lines(plan),
        memlog.pool_end(GiB),
        *memlog.host_pool_lines(plan),
    ]:
        log.feed("[2026-12-01 05:00:00 TP0] " + line)
    got = log.measurement()
    product: dict[str, Any] = {p.name: p.device for p in planned(name, mode)}
    assert got.device_pools == product
    hosts = {"kv" if p.name == "kv" else p.name: p.host for p in planned(name, mode)}
    assert got.host_pools == hosts


def test_simulated_ranks_print_the_pools_of_gpt_oss(start_fake_server):
    model = str(MODELS / "gpt-oss-120b")
    server = start_fake_server(
        ["--model-path", model, "--tp-size", "2", "--enable-hicache", "--hicache-ratio", "2"]
    )
    wait_until(lambda: len(server.log_lines("Allocating swa")) == 2, what="both ranks' pools")
    for rank in ("TP0", "TP1"):
        mine = [line for line in server.log_text().splitlines() if f" {rank}]" in line]
        pooled = [line for line in mine if "KV Cache is allocated" in line]
        assert [line.split("] ", 1)[1].split(" KV")[0] for line in pooled] == ["Full", "SWA"]
    log = SizingLog()
    for line in server.log_text().splitlines():
        log.feed(line)
    got = log.measurement().device_pools or {}
    assert set(got) == {"full", "swa"}
    assert got["swa"] == int(got["full"] * 0.8)
