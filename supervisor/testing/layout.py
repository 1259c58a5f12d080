"""How the simulated server lays itself out: scheduler titles and GPUs per rank, pool sizes, info.

Written from SGLang's launcher (entrypoints/engine.py `_calculate_rank_ranges`,
`compute_local_gpu_id`, managers/data_parallel_controller.py) and sized with
supervisor/testing/sizing.py, never with the supervisor's own arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.testing import gpu_state, sizing
from supervisor.testing.args import SimArgs
from supervisor.testing.scenario import Scenario

GB = 10**9


def scheduler_title(args: SimArgs, dp_rank: int, pp_rank: int, tp_rank: int) -> str:
    """SGLang's scheduler title: sglang::scheduler + _DP/_PP/_TP/_EP parts."""
    title = "sglang::scheduler"
    if args.dp_size > 1:
        title += f"_DP{dp_rank}"
    if args.pp_size > 1:
        title += f"_PP{pp_rank}"
    if args.tp_size > 1:
        title += f"_TP{tp_rank}"
    if args.ep_size > 1:
        title += f"_EP{tp_rank // max(1, args.tp_size // args.ep_size)}"
    return title


def _replicas(args: SimArgs) -> int:
    """Plain data parallelism runs dp_size whole TP worlds; DP attention shares one."""
    if args.enable_dp_attention or args.attn_dp_size > 1:
        return 1
    return args.dp_size


def local_ranks(args: SimArgs) -> list[tuple[str, str, int]]:
    """(title, log prefix, gpu index) for each scheduler on this node, in SGLang's order."""
    pp_per_node = max(args.pp_size // args.nnodes, 1)
    nnodes_per_pp_rank = max(args.nnodes // args.pp_size, 1)
    tp_per_node = args.tp_size // nnodes_per_pp_rank
    pp_first = pp_per_node * (args.node_rank // nnodes_per_pp_rank)
    tp_first = tp_per_node * (args.node_rank % nnodes_per_pp_rank)
    attn_dp = args.attn_dp_size if args.attn_dp_size > 1 else args.dp_size
    out: list[tuple[str, str, int]] = []
    for replica in range(_replicas(args)):
        replica_base = replica * args.tp_size * args.pp_size * args.gpu_id_step
        for pp_rank in range(pp_first, pp_first + pp_per_node):
            for tp_rank in range(tp_first, tp_first + tp_per_node):
                if _replicas(args) > 1:
                    dp_rank = replica
                else:  # DP attention: the dp rank is a slice of the TP group
                    dp_rank = tp_rank // max(1, args.tp_size // attn_dp)
                gpu = (
                    args.base_gpu_id
                    + replica_base
                    + (pp_rank % pp_per_node) * tp_per_node
                    + (tp_rank % tp_per_node) * args.gpu_id_step
                )
                title = scheduler_title(args, dp_rank, pp_rank, tp_rank)
                prefix = title.removeprefix("sglang::scheduler_").replace("_", " ")
                out.append((title, "" if prefix == "sglang::scheduler" else prefix, gpu))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    bytes_per_token: int
    device_tokens: int
    pool_tokens: int
    pool_bytes: int
    gpu_total_bytes: int
    gpu_used_bytes: int
    attention_kind: str


def size_server(args: SimArgs, scenario: Scenario, gpus: Sequence[Any]) -> Sizing:
    """Device tokens and host pool per rank, as SGLang computes them (testing/sizing.py)."""
    config = sizing.read_model_config(args.model_path)
    try:
        geo = sizing.geometry(config, args)
    except (KeyError, TypeError, ValueError):
        geo = sizing.geometry(sizing.DEFAULT_MODEL_CONFIG, args)
    total = scenario.gpu_total_bytes or (
        min(g.total_bytes for g in gpus) if gpus else gpu_state.DEFAULT_TOTAL_BYTES
    )
    fraction = args.mem_fraction_static or sizing.mem_fraction_static(total, args, mla=geo.mla)
    tokens = scenario.max_total_num_tokens or sizing.device_tokens(
        free_before_bytes=total
        - gpu_state.DEFAULT_BASELINE_USED_BYTES
        - scenario.cuda_context_bytes,
        weights_bytes=scenario.weight_bytes_per_rank,
        mem_fraction=fraction,
        cell_bytes=geo.size_per_token + geo.indexer_per_token,
        page_size=args.page_size or 1,
        max_total_tokens=args.max_total_tokens,
    )
    pool_tokens = (
        sizing.host_pool_tokens(args, geo.size_per_token, tokens)
        if args.enable_hierarchical_cache
        else 0
    )
    return Sizing(
        bytes_per_token=geo.size_per_token,
        device_tokens=tokens,
        pool_tokens=pool_tokens,
        pool_bytes=pool_tokens * (geo.size_per_token + geo.indexer_per_token),
        gpu_total_bytes=total,
        gpu_used_bytes=int(total * fraction),
        attention_kind=geo.kind,
    )


def mask_argv(argv: Sequence[str]) -> str:
    """The launch command as /server_info shows it, API keys masked."""
    out = list(argv)
    for i, token in enumerate(out):
        name, eq, _value = token.partition("=")
        if name in ("--api-key", "--admin-api-key"):
            if eq:
                out[i] = f"{name}=***"
            elif i + 1 < len(out):
                out[i + 1] = "***"
    return " ".join(out)


def server_info(args: SimArgs, sizing_: Sizing, argv: Sequence[str]) -> dict[str, Any]:
    model_path = args.model_path
    served = args.served_model_name or model_path
    kv_gb = sizing_.device_tokens * sizing_.bytes_per_token / GB
    info = {
        "model_path": model_path,
        "served_model_name": served,
        "tp_size": args.tp_size,
        "dp_size": args.dp_size,
        "pp_size": args.pp_size,
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "host": args.host,
        "port": args.port,
        "base_gpu_id": args.base_gpu_id,
        "gpu_id_step": args.gpu_id_step,
        "page_size": args.page_size or 1,
        "enable_hierarchical_cache": args.enable_hierarchical_cache,
        "hicache_ratio": args.hicache_ratio,
        "hicache_size": args.hicache_size,
        "enable_metrics": args.enable_metrics,
        "launch_command": mask_argv(argv),
        "max_total_num_tokens": sizing_.device_tokens,
        "internal_states": [{"max_total_num_tokens": sizing_.device_tokens}],
        "version": "0.5.23 (simulated)",
    }
    return {
        "served_model_name": served,
        "max_total_num_tokens": sizing_.device_tokens,
        "hicache_host_total_tokens": sizing_.pool_tokens,
        "kv_cache_gb": round(kv_gb, 2),
        "server_info": info,
        "model_info": {
            "model_path": model_path,
            "tokenizer_path": model_path,
            "is_generation": True,
            "served_model_name": served,
            "architectures": ["FakeForCausalLM"],
        },
        "models": {
            "object": "list",
            "data": [{"id": served, "object": "model", "owned_by": "sglang", "root": served}],
        },
    }
