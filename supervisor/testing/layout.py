"""How the simulated server sizes itself (pools per rank, what each rank loads) and what its
info endpoints say. Sized with supervisor/testing/sizing.py, never with the supervisor's own
arithmetic; the process tree and titles are in supervisor/testing/topology.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.testing import gpu_state, hybrid, memlog, sizing
from supervisor.testing.args import SimArgs
from supervisor.testing.scenario import Scenario

GB = 10**9


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    bytes_per_token: int
    device_tokens: int
    pool_tokens: int
    pool_bytes: int  # the host pools' real size, DSA indexer included
    gpu_total_bytes: int
    attention_kind: str
    memory: memlog.MemoryPlan


def size_server(args: SimArgs, scenario: Scenario, gpus: Sequence[Any]) -> Sizing:
    """Device tokens and host pool per rank, as SGLang computes them (testing/sizing.py)."""
    config = sizing.read_model_config(args.model_path)
    try:
        geo = sizing.geometry(config, args)
    except (KeyError, TypeError, ValueError):
        config = dict(sizing.DEFAULT_MODEL_CONFIG)
        geo = sizing.geometry(config, args)
    total = scenario.gpu_total_bytes or (
        min(g.total_bytes for g in gpus) if gpus else gpu_state.DEFAULT_TOTAL_BYTES
    )
    fraction = args.mem_fraction_static or sizing.mem_fraction_static(total, args, mla=geo.mla)
    free_before = total - gpu_state.DEFAULT_BASELINE_USED_BYTES - scenario.cuda_context_bytes
    pools = _hybrid_pools(config, args, scenario, free_before, fraction)
    tokens = scenario.max_total_num_tokens or sizing.device_tokens(
        free_before_bytes=free_before,
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
    pool_bytes = pool_tokens * (geo.size_per_token + geo.indexer_per_token)
    if pools:
        anchor = next(p for p in pools if p.host_label in ("full", "kv"))
        tokens, pool_tokens = anchor.size, anchor.host_size
        pool_bytes = sum(p.host_size * p.row for p in pools)
    return Sizing(
        bytes_per_token=geo.size_per_token,
        device_tokens=tokens,
        pool_tokens=pool_tokens,
        pool_bytes=pool_bytes,
        gpu_total_bytes=total,
        attention_kind=geo.kind,
        memory=memlog.MemoryPlan(
            architecture=memlog.architecture(config),
            quant=memlog.quant_log(config),
            kv_dtype=memlog.kv_dtype(config, args.kv_cache_dtype),
            kind=geo.kind,
            page_size=args.page_size or 1,
            device_tokens=tokens,
            k_per_token=geo.size_per_token - geo.v_per_token,
            v_per_token=geo.v_per_token,
            indexer_per_token=geo.indexer_per_token,
            weights_bytes=scenario.weight_bytes_per_rank,
            cuda_context_bytes=scenario.cuda_context_bytes,
            host_tokens=pool_tokens,
            host_layout=memlog.host_layout(args.hicache_mem_layout, args.hicache_io_backend),
            pools=tuple(pools),
        ),
    )


def _hybrid_pools(
    config: dict[str, Any],
    args: SimArgs,
    scenario: Scenario,
    free_before: int,
    fraction: float,
) -> list[hybrid.SimPool]:
    """A hybrid model's pools with their host pools (testing/hybrid.py); none for a model of
    one pool, or a scenario that fixes the token count."""
    if scenario.max_total_num_tokens:
        return []
    rest = sizing.kv_budget_gib(free_before, scenario.weight_bytes_per_rank, fraction)
    itemsize = sizing.kv_itemsize(config, args.kv_cache_dtype)
    try:
        pools = hybrid.device_pools(config, args, rest, itemsize) or []
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return []  # a config SGLang could not size either: the pre-flight refuses it first
    if not pools or not args.enable_hierarchical_cache:
        return pools
    ratio = args.hicache_ratio if args.hicache_ratio is not None else sizing.default_ratio(args)
    return hybrid.with_host_pools(args, pools, ratio)


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
    kv_gb = sizing_.memory.device_bytes() / memlog.GIB
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
            "architectures": [sizing_.memory.architecture],
        },
        "models": {
            "object": "list",
            "data": [{"id": served, "object": "model", "owned_by": "sglang", "root": served}],
        },
    }
