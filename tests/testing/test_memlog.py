"""The ranks' memory log lines in SGLang 0.5.23's formats (supervisor/testing/memlog.py), and their
agreement with what the ranks register on the simulated GPUs."""

from __future__ import annotations

import dataclasses
import re

from supervisor.testing import fake_nvml, gpu_state, memlog
from tests.waiting import wait_until

GIB = 1 << 30
PLAN = memlog.MemoryPlan(
    architecture="LlamaForCausalLM",
    quant=None,
    kv_dtype="torch.bfloat16",
    kind="MHA",
    page_size=1,
    device_tokens=2**21 - 1,  # + the padded page: 2**21 rows
    k_per_token=512,
    v_per_token=1024,
    indexer_per_token=0,
    weights_bytes=20 * GIB,
    cuda_context_bytes=0,
    host_tokens=0,
    host_layout="page_first",
)


def test_mha_logs_k_and_v_apart_in_gib_with_the_padded_page():
    assert memlog.kv_allocated(PLAN) == (
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 2097151, "
        "K size: 1.00 GB, V size: 2.00 GB"
    )


def test_mla_logs_one_kv_size_and_dsa_adds_its_index_keys():
    mla = dataclasses.replace(PLAN, kind="MLA", k_per_token=1024, v_per_token=0)
    assert memlog.kv_allocated(mla).endswith("#tokens: 2097151, KV size: 2.00 GB")
    # DSA: (2**21 - 1 + 64 + 1) // 64 pages of 64 rows of 512 index bytes = 1 GiB more.
    dsa = dataclasses.replace(mla, kind="DSA", page_size=64, indexer_per_token=512)
    dsa = dataclasses.replace(dsa, device_tokens=2**21 - 64)
    assert memlog.kv_allocated(dsa).endswith("KV size: 3.00 GB")


def test_load_lines_use_gib_and_name_the_model_class_and_its_quantisation():
    assert memlog.load_begin(80 * GIB) == "Load weight begin. avail mem=80.00 GB"
    assert memlog.load_end(PLAN, 12.345, 60 * GIB) == (
        "Load weight end. elapsed=12.35 s, type=LlamaForCausalLM, avail mem=60.00 GB, "
        "mem usage=20.00 GB."
    )
    config = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "other": 1}}
    quantised = dataclasses.replace(PLAN, quant=memlog.quant_log(config))
    assert "type=LlamaForCausalLM, quant=fp8, fmt=e4m3, avail mem=" in memlog.load_end(
        quantised, 1.0, GIB
    )
    assert memlog.pool_end(GIB + GIB // 2) == "Memory pool end. avail mem=1.50 GB"


def test_kv_dtype_follows_the_flag_then_the_checkpoint():
    assert memlog.kv_dtype({"torch_dtype": "float16"}, "auto") == "torch.float16"
    assert memlog.kv_dtype({}, "fp8_e5m2") == "torch.float8_e5m2"
    fp8_ckpt = {"quantization_config": {"kv_cache_quant_algo": "FP8"}}
    assert memlog.kv_dtype(fp8_ckpt, "auto") == "torch.float8_e4m3fn"


def test_host_pool_lines_use_the_kv_label_and_decimal_gb():
    host = dataclasses.replace(PLAN, host_tokens=2 * PLAN.device_tokens)
    # 4,194,302 tokens × 1,536 B = 6,442,447,872 B = 6.44 GB (1e9).
    assert memlog.host_pool_lines(host) == [
        "Allocating kv hierarchical KV host pool: 4194302 tokens, 6.44 GB host memory."
    ]
    small = dataclasses.replace(PLAN, host_tokens=1000)
    assert memlog.host_pool_lines(small)[0].startswith(
        "HiCache kv host pool (1000 tokens) is smaller than the device pool (2097151 tokens);"
    )
    dsa = dataclasses.replace(host, kind="DSA", indexer_per_token=132, host_layout="page_first")
    assert memlog.host_pool_lines(dsa)[-1] == (
        "Allocating 0.55 GB host memory for DSA indexer (layout=page_first)."
    )


def _gib(line: str, key: str) -> float:
    match = re.search(rf"{key}=([0-9.]+) GB", line)
    assert match, line
    return float(match.group(1))


def test_a_rank_reports_what_it_holds_on_its_simulated_gpu(start_fake_server, make_gpu_state):
    state = make_gpu_state(1)
    weights, context, tokens = 20 * GIB, GIB, 100_000
    server = start_fake_server(
        state_dir=state,
        scenario={
            "weight_bytes_per_rank": weights,
            "cuda_context_bytes": context,
            "max_total_num_tokens": tokens,
        },
    )
    wait_until(lambda: server.log_lines("Memory pool end."), what="the pool allocated")
    free0 = gpu_state.DEFAULT_TOTAL_BYTES - gpu_state.DEFAULT_BASELINE_USED_BYTES - context
    begin = server.log_lines("Load weight begin.")[0]
    assert _gib(begin, "avail mem") == round(free0 / GIB, 2)
    end = server.log_lines("Load weight end.")[0]
    assert _gib(end, "mem usage") == 20.00
    assert _gib(end, "avail mem") == round((free0 - weights) / GIB, 2)
    # Llama-3-70B on one rank: K = V = 8 heads × 128 × 80 layers × 2 B per row.
    half = (tokens + 1) * 8 * 128 * 80 * 2
    kv = server.log_lines("KV Cache is allocated.")[0]
    assert kv.endswith(f"#tokens: {tokens}, K size: 15.26 GB, V size: 15.26 GB")
    pool_end = _gib(server.log_lines("Memory pool end.")[0], "avail mem")
    assert pool_end == round((free0 - weights - 2 * half) / GIB, 2)
    fake_nvml.set_state_dir(state)
    try:
        fake_nvml.nvmlInit()
        info = fake_nvml.nvmlDeviceGetMemoryInfo(fake_nvml.nvmlDeviceGetHandleByIndex(0))
        assert round(info.free / GIB, 2) == pool_end
    finally:
        fake_nvml.nvmlShutdown()
        fake_nvml.set_state_dir(None)
