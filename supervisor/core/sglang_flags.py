"""The launch_server flags the supervisor interprets, their aliases and value checks.

Data for supervisor/core/sglang_args.py: SGLang 0.5.23's names and defaults (docs/sglang.md §2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from supervisor.core.units import parse_token_count


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def _pos_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise ValueError("must be in (0, 1]")
    return value


def _pos_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _str(text: str) -> str:
    return text


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError("must be a TCP port (1-65535)")
    return value


def _tokens(text: str) -> int:
    return parse_token_count(text)


@dataclass(frozen=True, slots=True)
class Option:
    dest: str
    names: tuple[str, ...]
    convert: Callable[[str], object] | None  # None: a store_true flag
    reason: str = ""  # human description of the accepted values, for error messages


_KV_DTYPES = (
    "auto",
    "fp8_e5m2",
    "fp8_e4m3",
    "mxfp8",
    "bf16",
    "bfloat16",
    "nvfp4",
    "fp4_mx_block16",
)


def _kv_dtype(text: str) -> str:
    if text not in _KV_DTYPES:
        raise ValueError(f"must be one of {', '.join(_KV_DTYPES)}")
    return text


OPTIONS: tuple[Option, ...] = (
    Option("model_path", ("--model-path", "--model"), _str),
    Option("tp_size", ("--tp-size", "--tensor-parallel-size"), _pos_int, "a positive integer"),
    Option("dp_size", ("--dp-size", "--data-parallel-size"), _pos_int, "a positive integer"),
    Option("pp_size", ("--pp-size", "--pipeline-parallel-size"), _pos_int, "a positive integer"),
    Option(
        "attn_dp_size",
        ("--attn-dp-size", "--attention-data-parallel-size"),
        _pos_int,
        "a positive integer",
    ),
    Option("enable_dp_attention", ("--enable-dp-attention",), None),
    Option("ep_size", ("--ep-size", "--expert-parallel-size", "--ep"), _pos_int, "an integer"),
    Option("nnodes", ("--nnodes",), _pos_int, "a positive integer"),
    Option("node_rank", ("--node-rank",), _nonneg_int, "a non-negative integer"),
    Option("mem_fraction_static", ("--mem-fraction-static",), _fraction, "a fraction in (0, 1]"),
    Option("max_total_tokens", ("--max-total-tokens",), _tokens, "a token count like 131072"),
    Option("kv_cache_dtype", ("--kv-cache-dtype",), _kv_dtype),
    Option("page_size", ("--page-size",), _pos_int, "a positive integer"),
    Option("enable_hierarchical_cache", ("--enable-hierarchical-cache", "--enable-hicache"), None),
    Option("hicache_ratio", ("--hicache-ratio",), _pos_float, "a positive number"),
    Option("hicache_size_gb", ("--hicache-size",), _nonneg_int, "a non-negative integer (GB)"),
    Option(
        "hicache_host_memory_fraction",
        ("--hicache-host-memory-fraction",),
        _fraction,
        "a fraction in (0, 1]",
    ),
    Option("hicache_host_memory_mode", ("--hicache-host-memory-mode",), _str),
    Option("hicache_mem_layout", ("--hicache-mem-layout",), _str),
    Option("hicache_storage_backend", ("--hicache-storage-backend",), _str),
    Option("host", ("--host",), _str),
    Option("port", ("--port",), _port),
    Option("base_gpu_id", ("--base-gpu-id",), _nonneg_int, "a non-negative integer"),
    Option("gpu_id_step", ("--gpu-id-step",), _pos_int, "a positive integer"),
    Option("weight_loader_disable_mmap", ("--weight-loader-disable-mmap",), None),
    Option("cpu_offload_gb", ("--cpu-offload-gb",), _nonneg_int, "a non-negative integer (GB)"),
    Option("speculative_algorithm", ("--speculative-algorithm",), _str),
    Option("speculative_draft_model_path", ("--speculative-draft-model-path",), _str),
    Option("speculative_num_steps", ("--speculative-num-steps",), _pos_int, "an integer"),
    Option("speculative_eagle_topk", ("--speculative-eagle-topk",), _pos_int, "an integer"),
    Option(
        "speculative_num_draft_tokens", ("--speculative-num-draft-tokens",), _pos_int, "an integer"
    ),
    Option("api_key", ("--api-key",), _str),
    Option("admin_api_key", ("--admin-api-key",), _str),
    Option("enable_metrics", ("--enable-metrics",), None),
    Option("skip_server_warmup", ("--skip-server-warmup",), None),
    Option("served_model_name", ("--served-model-name",), _str),
    Option("config_file", ("--config",), _str),
    Option("tokenizer_worker_num", ("--tokenizer-worker-num",), _pos_int, "a positive integer"),
    Option("numa_node", ("--numa-node",), _str),
)

# Other launch_server flags that share prefixes with the ones above. They are passed through, but
# argparse counts them when it resolves an abbreviation, so they make `--pp` ambiguous as in SGLang.
OTHER_FLAGS: tuple[str, ...] = (
    "--pp-max-micro-batch-size",
    "--pp-async-batch-depth",
    "--tokenizer-path",
    "--tokenizer-mode",
    "--detokenizer-worker-num",
    "--tool-call-parser",
    "--torch-compile-max-bs",
    "--torchao-config",
    "--model-impl",
    "--model-loader-extra-config",
    "--modelopt-quant",
    "--max-running-requests",
    "--max-prefill-tokens",
    "--max-queued-requests",
    "--ep-num-redundant-experts",
    "--ep-dispatch-algorithm",
    "--dist-init-addr",
    "--dist-timeout",
    "--disable-cuda-graph",
    "--disable-radix-cache",
    "--enable-torch-compile",
    "--enable-mixed-chunk",
    "--enable-cache-report",
    "--hicache-write-policy",
    "--hicache-io-backend",
    "--hicache-storage-prefetch-policy",
    "--host-port",
    "--port-range",
    "--weight-loader-prefetch-checkpoints",
    "--weight-loader-drop-cache-after-load",
    "--watchdog-timeout",
    "--soft-watchdog-timeout",
    "--nccl-port",
    "--nccl-init-addr",
    "--gated-launch-port",
    "--trust-remote-code",
    "--chunked-prefill-size",
    "--cuda-graph-max-bs",
    "--quantization",
    "--dtype",
    "--context-length",
    "--log-level",
    "--attention-backend",
)

BY_NAME: dict[str, Option] = {name: opt for opt in OPTIONS for name in opt.names}
ALL_NAMES: tuple[str, ...] = tuple(sorted(set(BY_NAME) | set(OTHER_FLAGS)))
