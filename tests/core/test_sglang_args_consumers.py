"""The flags of SGLang's opt-in host consumers: read with SGLang 0.5.23's defaults, bad values
refused naming the flag (the pre-flight exits 2 on them)."""

from __future__ import annotations

import re

import pytest

from supervisor.core.sglang_args import ArgvError, LaunchPlan, parse_launch_args
from supervisor.core.sglang_versions import rules_for_version

STRICT = rules_for_version("0.5.23").cli()


def parse(*args: str) -> LaunchPlan:
    return parse_launch_args(["--model-path", "/m", *args], STRICT)


def test_defaults_match_sglang_0_5_23():
    plan = parse()
    # arg_groups/fields/exec_.py, lora.py, memory.py
    assert (plan.enable_memory_saver, plan.enable_weights_cpu_backup) == (False, False)
    assert (plan.kt_weight_path, plan.kt_num_gpu_experts) == (None, None)
    assert (plan.offload_group_size, plan.offload_num_in_group, plan.offload_mode) == (-1, 1, "cpu")
    assert (plan.lora_paths, plan.max_loaded_loras, plan.max_loras_per_batch) == ((), None, 8)
    assert (plan.enable_hisparse, plan.hisparse_config) == (False, None)
    assert (plan.enable_lmcache, plan.enable_flexkv, plan.cpu_offload_gb) == (False, False, 0)
    assert plan.tokenizer_worker_num == 1


def test_the_consumer_flags_are_read():
    plan = parse(
        "--enable-memory-saver", "--enable-weights-cpu-backup", "--kt-weight-path", "/kt",
        "--kt-num-gpu-experts", "32", "--offload-group-size", "4", "--offload-num-in-group", "2",
        "--offload-mode", "shm_cpu", "--lora-paths", "a=/a", "b=/b", "--max-loaded-loras", "9",
        "--hierarchical-sparse-attention-extra-config", '{"host_to_device_ratio": 3}',
        "--enable-hisparse", "--hicache-storage-backend-extra-config", "@/etc/kv.toml",
    )  # fmt: skip
    assert plan.enable_weights_cpu_backup
    assert plan.enable_memory_saver
    assert (plan.kt_weight_path, plan.kt_num_gpu_experts) == ("/kt", 32)
    assert (plan.offload_group_size, plan.offload_num_in_group, plan.offload_mode) == (
        4,
        2,
        "shm_cpu",
    )
    assert (plan.lora_paths, plan.max_loaded_loras) == (("a=/a", "b=/b"), 9)
    assert plan.hisparse_config == '{"host_to_device_ratio": 3}'
    assert plan.hicache_storage_backend_extra_config == "@/etc/kv.toml"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--offload-mode", "gpu"], "--offload-mode 'gpu': must be one of meta, cpu, shm_cpu"),
        (["--offload-group-size", "-2"], "--offload-group-size -2: must be -1 (off) or a positive"),
        (["--offload-group-size", "x"], "argument --offload-group-size: invalid int value: 'x'"),
        (["--offload-num-in-group", "0"], "--offload-num-in-group 0: must be at least 1"),
        (["--kt-num-gpu-experts", "-1"], "--kt-num-gpu-experts -1: must not be negative"),
        (["--max-loaded-loras", "0"], "--max-loaded-loras 0: must be at least 1"),
        (["--max-loaded-loras", "many"], "argument --max-loaded-loras: invalid int value"),
        (["--tokenizer-worker-num", "-3"], "--tokenizer-worker-num -3: must be at least 1"),
        (["--cpu-offload-gb", "-1"], "--cpu-offload-gb -1: must not be negative"),
        (["--cpu-offload-gb", "2.5"], "argument --cpu-offload-gb: invalid int value: '2.5'"),
        (["--hisparse-config", "{top_k: 1}"], "--hisparse-config '{top_k: 1}': not JSON"),
        (["--hisparse-config", "[2]"], "--hisparse-config '[2]': must be a JSON object"),
        (["--hicache-storage-backend-extra-config", "{"], "extra-config '{': not JSON"),
    ],
)
def test_bad_values_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ArgvError, match=re.escape(message)):
        parse(*argv)
