"""The launch_server flags the supervisor interprets, and the checks of their values.

SGLang's own table of every flag (names, arity, type, choices) is core/sglang_cli_data.py; this
module says which of them the supervisor reads into a LaunchPlan, under which name, and what
it accepts (docs/sglang.md §2). A flag an older release lacks is simply never given there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.core.bounded import path_problem
from supervisor.core.secret_names import is_secret_name
from supervisor.core.sglang_cli import CliFlag
from supervisor.core.units import parse_token_count


def _nonneg_int(value: object) -> int:
    number = int(str(value))
    if number < 0:
        raise ValueError("must not be negative")
    return number


def _pos_int(value: object) -> int:
    number = int(str(value))
    if number < 1:
        raise ValueError("must be at least 1")
    return number


def _gigabytes(value: object) -> int:
    number = _nonneg_int(value)
    if number > 1_000_000:  # 1 PB: past it the GB arithmetic overflows a float
        raise ValueError("must be at most 1,000,000 (GB, 1 PB)")
    return number


def _fraction(value: object) -> float:
    number = float(str(value))
    if not 0.0 < number <= 1.0:
        raise ValueError("must be in (0, 1]")
    return number


def _pos_float(value: object) -> float:
    number = float(str(value))
    # argparse's float() takes "nan" and "inf": a pool of NaN or infinitely many tokens.
    if not (number > 0 and math.isfinite(number)):
        raise ValueError("must be a finite positive number")
    return number


def _str(value: object) -> str:
    return str(value)


def _path(value: object) -> str:
    text = str(value)
    if not text.strip():
        raise ValueError("must name a model (a directory or a Hugging Face id), not be empty")
    problem = path_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


def _port(value: object) -> int:
    number = int(str(value))
    if not 0 < number < 65536:
        raise ValueError("must be a TCP port (1-65535)")
    return number


def _tokens(value: object) -> int:
    return parse_token_count(str(value))


def _int(value: object) -> int:
    return int(str(value))


def _ints(value: object) -> tuple[int, ...]:
    items = value if isinstance(value, list | tuple) else [value]
    return tuple(_nonneg_int(v) for v in items)


def _strs(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list | tuple) else [value]
    return tuple(str(v) for v in items)


def _group_size(value: object) -> int:
    number = int(str(value))
    if number < -1:  # SGLang's default -1 and 0 both mean off (utils/offloader.py:73)
        raise ValueError("must be -1 (off) or a positive integer")
    return number


# _BaseParamOffloader.create's table (utils/offloader.py:387-392): any other mode is a KeyError
# when the first layer is wrapped, minutes into the launch.
OFFLOAD_MODES = ("meta", "cpu", "shm_cpu", "sharded_gpu")


def _offload_mode(value: object) -> str:
    text = str(value)
    if text not in OFFLOAD_MODES:
        raise ValueError(f"must be one of {', '.join(OFFLOAD_MODES)}")
    return text


def _json_or_file(value: object) -> str:
    """A JSON object, or `@file` (SGLang reads the file; the supervisor does not)."""
    text = str(value)
    return text if text.startswith("@") else _json_object(text)


def _json_object(value: object) -> str:
    """A JSON object, which SGLang json.loads at start (mem_cache/sparsity/factory.py:70-75)."""
    text = str(value)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise ValueError("must be a JSON object")
    return text


@dataclass(frozen=True, slots=True)
class Option:
    dest: str  # the LaunchPlan field
    names: tuple[str, ...]  # SGLang's spellings, the first being the flag's own
    convert: Callable[[object], object] | None  # None: a switch
    reason: str = ""  # human description of the accepted values, for error messages


OPTIONS: tuple[Option, ...] = (
    Option("model_path", ("--model-path", "--model"), _path),
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
    Option("kv_cache_dtype", ("--kv-cache-dtype",), _str),
    Option("page_size", ("--page-size",), _pos_int, "a positive integer"),
    Option("enable_hierarchical_cache", ("--enable-hierarchical-cache", "--enable-hicache"), None),
    Option("hicache_ratio", ("--hicache-ratio",), _pos_float, "e.g. 2.0"),
    Option("hicache_size_gb", ("--hicache-size",), _gigabytes, "a non-negative integer (GB)"),
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
    Option("device", ("--device",), _str),
    Option("base_gpu_id", ("--base-gpu-id",), _nonneg_int, "a non-negative integer"),
    Option("gpu_id_step", ("--gpu-id-step",), _pos_int, "a positive integer"),
    Option("weight_loader_disable_mmap", ("--weight-loader-disable-mmap",), None),
    Option("cpu_offload_gb", ("--cpu-offload-gb",), _gigabytes, "a non-negative integer (GiB)"),
    Option("speculative_algorithm", ("--speculative-algorithm",), _str),
    Option("speculative_draft_model_path", ("--speculative-draft-model-path",), _path),
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
    Option("numa_node", ("--numa-node",), _ints, "GPU NUMA nodes, one integer each"),
    Option("chunked_prefill_size", ("--chunked-prefill-size",), _int, "an integer (-1: off)"),
    Option(
        "swa_full_tokens_ratio", ("--swa-full-tokens-ratio",), _fraction, "a fraction in (0, 1]"
    ),
    Option("disable_hybrid_swa_memory", ("--disable-hybrid-swa-memory",), None),
    Option("mamba_full_memory_ratio", ("--mamba-full-memory-ratio",), _pos_float, "e.g. 0.9"),
    Option("max_mamba_cache_size", ("--max-mamba-cache-size",), _pos_int, "a positive integer"),
    Option("mamba_ssm_dtype", ("--mamba-ssm-dtype",), _str),
    # The opt-in host-memory consumers (core/host_consumers.py).
    Option("enable_memory_saver", ("--enable-memory-saver",), None),
    Option("enable_weights_cpu_backup", ("--enable-weights-cpu-backup",), None),
    Option("enable_draft_weights_cpu_backup", ("--enable-draft-weights-cpu-backup",), None),
    Option("kt_weight_path", ("--kt-weight-path",), _str),
    Option("kt_num_gpu_experts", ("--kt-num-gpu-experts",), _nonneg_int, "a non-negative integer"),
    Option("offload_group_size", ("--offload-group-size",), _group_size),
    Option("offload_num_in_group", ("--offload-num-in-group",), _pos_int, "a positive integer"),
    Option("offload_mode", ("--offload-mode",), _offload_mode),
    Option("enable_lora", ("--enable-lora",), None),
    Option("lora_paths", ("--lora-paths",), _strs),
    Option("max_loaded_loras", ("--max-loaded-loras",), _pos_int, "a positive integer"),
    Option("max_loras_per_batch", ("--max-loras-per-batch",), _pos_int, "a positive integer"),
    Option("enable_lora_overlap_loading", ("--enable-lora-overlap-loading",), None),
    Option(
        "hicache_storage_backend_extra_config",
        ("--hicache-storage-backend-extra-config",),
        _json_or_file,
    ),
    Option("enable_hisparse", ("--enable-hisparse",), None),
    Option(
        "hisparse_config",
        ("--hisparse-config", "--hierarchical-sparse-attention-extra-config"),
        _json_object,
    ),
    Option("enable_lmcache", ("--enable-lmcache",), None),
    Option("lmcache_config_file", ("--lmcache-config-file",), _str),
    Option("enable_flexkv", ("--enable-flexkv",), None),
    Option("flexkv_config_file", ("--flexkv-config-file",), _str),
)

# SGLang's flags that take a string and have a secret word in their name (core/secret_names.py)
# but whose value is no secret. Every other such flag of a release's table is a secret flag;
# tests/core/test_sglang_flags.py lists what this rule makes of each release's table.
NOT_SECRET_FLAGS: dict[str, str] = {
    "--speculative-token-map": "a file of token ids (a path)",
}


def is_secret_flag(flag: CliFlag) -> bool:
    """The flag's value is a secret: masked in every log line, state file and report.

    A flag is secret when it takes a string value (a switch or a number is no secret) and one of
    its spellings is a secret name (--api-key, --admin-api-key, --ssl-keyfile-password), unless
    NOT_SECRET_FLAGS says otherwise. Read from the release's table, so a secret flag a new
    release adds is masked as soon as the table is regenerated.
    """
    takes_text = flag.nargs != 0 and flag.kind == "str" and flag.choices is None
    if not takes_text or flag.action in ("store_true", "bool_optional"):
        return False
    named = any(is_secret_name(name[2:]) for name in flag.names)
    return named and not any(name in NOT_SECRET_FLAGS for name in flag.names)
