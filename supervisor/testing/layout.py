"""How the simulated server lays itself out: scheduler titles and GPUs per rank, pool sizes, info.

Pure helpers over the LaunchPlan; sizes come from the pre-flight's arithmetic (core.model_geometry,
core.fit) so the simulation allocates what the supervisor predicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core import fit, model_geometry
from supervisor.core.sglang_args import LaunchPlan, redact_argv
from supervisor.core.units import GB
from supervisor.testing import gpu_state
from supervisor.testing.scenario import Scenario

# Used when --model-path has no readable config.json: Llama-3-70B geometry (sglang.md §7).
DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
}


def scheduler_title(plan: LaunchPlan, dp_rank: int, pp_rank: int, tp_rank: int) -> str:
    """SGLang's scheduler title: sglang::scheduler + _DP/_PP/_TP/_EP parts (sglang.md §3)."""
    title = "sglang::scheduler"
    if plan.dp_size > 1:
        title += f"_DP{dp_rank}"
    if plan.pp_size > 1:
        title += f"_PP{pp_rank}"
    if plan.tp_size > 1:
        title += f"_TP{tp_rank}"
    if plan.ep_size > 1:
        title += f"_EP{tp_rank // max(1, plan.tp_size // plan.ep_size)}"
    return title


def local_ranks(plan: LaunchPlan) -> list[tuple[str, str, int]]:
    """(title, log prefix, gpu index) for each scheduler on this node, in SGLang's order."""
    tp_per_node = max(1, plan.tp_size // plan.nnodes) if plan.pp_size == 1 else plan.tp_size
    pp_per_node = max(1, plan.pp_size // plan.nnodes) if plan.pp_size > 1 else 1
    node_pp0 = plan.node_rank * pp_per_node if plan.pp_size > 1 else 0
    node_tp0 = plan.node_rank * tp_per_node if plan.pp_size == 1 else 0
    gpus = plan.local_gpu_ids()
    out: list[tuple[str, str, int]] = []
    attn_dp = plan.attn_dp_size if plan.attn_dp_size > 1 else plan.dp_size
    for replica in range(plan.data_parallel_replicas):
        for pp in range(pp_per_node):
            for tp in range(tp_per_node):
                tp_rank, pp_rank = node_tp0 + tp, node_pp0 + pp
                if plan.data_parallel_replicas > 1:
                    dp_rank = replica
                else:  # DP attention: the dp rank is a slice of the TP group
                    dp_rank = tp_rank // max(1, plan.tp_size // attn_dp)
                title = scheduler_title(plan, dp_rank, pp_rank, tp_rank)
                prefix = title.removeprefix("sglang::scheduler_").replace("_", " ")
                out.append((title, "" if prefix == "sglang::scheduler" else prefix, gpus[len(out)]))
    return out


def load_model_config(model_path: str) -> dict[str, Any]:
    try:
        from supervisor.adapters.model_config import load_model_config

        return dict(load_model_config(model_path).config)
    except Exception:  # noqa: BLE001 - any model the fake cannot read gets the default geometry
        return dict(DEFAULT_MODEL_CONFIG)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    bytes_per_token: int
    device_tokens: int
    pool_tokens: int
    pool_bytes: int
    gpu_total_bytes: int
    gpu_used_bytes: int
    attention_kind: str


def size_server(plan: LaunchPlan, scenario: Scenario, config: dict[str, Any], gpus: Any) -> Sizing:
    """Device tokens and host pool per rank with the pre-flight's arithmetic (core.fit)."""
    try:
        bpt = model_geometry.bytes_per_token_per_rank(config, plan)
        indexer = model_geometry.indexer_bytes_per_token_per_rank(config, plan)
        mla = model_geometry.is_mla(config)
        kind = model_geometry.attention_kind(config)
    except model_geometry.GeometryError:
        config = DEFAULT_MODEL_CONFIG
        bpt = model_geometry.bytes_per_token_per_rank(config, plan)
        indexer, mla, kind = 0, False, "mha"
    total = scenario.gpu_total_bytes or (
        min(g.total_bytes for g in gpus) if gpus else gpu_state.DEFAULT_TOTAL_BYTES
    )
    fraction = plan.mem_fraction_static or fit.auto_mem_fraction_static(total, plan, mla=mla)
    device_tokens = scenario.max_total_num_tokens or fit.estimate_device_tokens(
        gpu_free_bytes=total - gpu_state.DEFAULT_BASELINE_USED_BYTES,
        weights_per_rank_bytes=scenario.weight_bytes_per_rank,
        mem_fraction_static=fraction,
        bytes_per_token=bpt,
        page_size=plan.effective_page_size,
        max_total_tokens=plan.max_total_tokens,
    )
    pool_tokens = fit.host_pool_tokens(plan, bpt, device_tokens)
    return Sizing(
        bytes_per_token=bpt,
        device_tokens=device_tokens,
        pool_tokens=pool_tokens,
        pool_bytes=pool_tokens * (bpt + indexer),
        gpu_total_bytes=total,
        gpu_used_bytes=int(total * fraction),
        attention_kind=kind,
    )


def server_info(plan: LaunchPlan, sizing: Sizing, argv: Sequence[str]) -> dict[str, Any]:
    model_path = plan.model_path or ""
    served = plan.served_model_name or model_path
    kv_gb = sizing.device_tokens * sizing.bytes_per_token / GB
    server_info = {
        "model_path": model_path,
        "served_model_name": served,
        "tp_size": plan.tp_size,
        "dp_size": plan.dp_size,
        "pp_size": plan.pp_size,
        "nnodes": plan.nnodes,
        "node_rank": plan.node_rank,
        "host": plan.host,
        "port": plan.port,
        "base_gpu_id": plan.base_gpu_id,
        "gpu_id_step": plan.gpu_id_step,
        "page_size": plan.effective_page_size,
        "enable_hierarchical_cache": plan.enable_hierarchical_cache,
        "hicache_ratio": plan.hicache_ratio,
        "hicache_size": plan.hicache_size_gb,
        "enable_metrics": plan.enable_metrics,
        "launch_command": " ".join(redact_argv(argv)),
        "max_total_num_tokens": sizing.device_tokens,
        "internal_states": [{"max_total_num_tokens": sizing.device_tokens}],
        "version": "0.5.23 (simulated)",
    }
    return {
        "served_model_name": served,
        "max_total_num_tokens": sizing.device_tokens,
        "hicache_host_total_tokens": sizing.pool_tokens,
        "kv_cache_gb": round(kv_gb, 2),
        "server_info": server_info,
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
