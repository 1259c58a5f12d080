"""A rank's memory log lines in SGLang 0.5.23's words, and the free GPU memory they report.

Formats (paths under sglang/srt/):
- model_executor/model_runner.py `ModelRunner.load_model`: "Load weight begin. avail mem=X GB"
  and "Load weight end. elapsed=X s, type=Class, [quant=…, ]avail mem=X GB, mem usage=Y GB.";
  GB is 1 << 30 there (utils/common.py `get_available_gpu_memory`), the type is the model class
  (the config's architecture) and quant comes from `get_quantization_config_log_str`.
- mem_cache/memory_pool.py `KVCache._finalize_allocation_log` (GB = 1024**3): MHA sizes K and V
  apart, MLA and DSA give one KV size; every layer's buffer holds size + page_size rows (the
  padded page, `_create_buffers`), and DSA adds its index-key cache (mem_cache/index_key_cache.py).
  The dtype is the KV cache's (mem_cache/kv_cache_dtype.py `configure_kv_cache_dtype`).
- mem_cache/kv_cache_configurator.py: "Memory pool end. avail mem=X GB".
- mem_cache/pool_host/base.py `HostKVCache._allocate_host_buffer` (GB = 1e9): pool_label is "kv"
  for a plain model's pool (hybrid_cache/hybrid_pool_assembler.py `build_kv_host_pool`); the
  DSA indexer's host pool logs its own line (pool_host/dsa.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.testing import gpu_state
from supervisor.testing.hybrid import SimPool

GIB = 1 << 30
_KV_DTYPES = {
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
    "mxfp8": "torch.float8_e4m3fn",
    "bf16": "torch.bfloat16",
    "bfloat16": "torch.bfloat16",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPlan:
    """What one rank loads and allocates (the same on every rank of a launch)."""

    architecture: str
    quant: str | None
    kv_dtype: str
    kind: str  # "MHA" | "MLA" | "DSA"
    page_size: int
    device_tokens: int
    k_per_token: int  # MHA: K over all layers; MLA/DSA: the whole row
    v_per_token: int  # MHA: V; 0 for MLA/DSA
    indexer_per_token: int  # DSA index keys with scales, over all layers
    weights_bytes: int
    cuda_context_bytes: int
    host_tokens: int  # 0 without --enable-hierarchical-cache
    host_layout: str
    pools: tuple[SimPool, ...] = ()  # a hybrid model's pools (testing/hybrid.py), SGLang's order

    def device_bytes(self) -> int:
        """What the device pools hold: the simulated GPU is charged this."""
        if self.pools:
            return sum(p.device_bytes for p in self.pools)
        return sum(self.kv_sizes())

    def kv_sizes(self) -> tuple[int, ...]:
        """(K, V) bytes for MHA, (KV,) for MLA and DSA, as the device pool allocates them."""
        slots = self.device_tokens + self.page_size
        if self.kind == "MHA":
            return (slots * self.k_per_token, slots * self.v_per_token)
        kv = slots * self.k_per_token
        if self.kind == "DSA":
            pages = (self.device_tokens + self.page_size + 1) // self.page_size
            kv += pages * self.page_size * self.indexer_per_token
        return (kv,)


def architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else "LlamaForCausalLM"


def quant_log(config: Mapping[str, Any]) -> str | None:
    """`ModelConfig.get_quantization_config_log_str` for config.json's quantization_config."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping) or not quant:
        return None
    out = f"quant={quant.get('quant_method', 'quantized')}"
    for key in ("bits", "quant_algo", "fmt", "requantization_method"):
        if key in quant:
            out += f", {key}={quant[key]}"
    return out


def kv_dtype(config: Mapping[str, Any], kv_cache_dtype: str) -> str:
    if kv_cache_dtype != "auto":
        return _KV_DTYPES.get(kv_cache_dtype, "torch.float8_e4m3fn")
    quant = config.get("quantization_config") or {}
    if str(quant.get("kv_cache_quant_algo", "")).upper() == "FP8":
        return "torch.float8_e4m3fn"
    return "torch." + str(config.get("torch_dtype", "bfloat16")).removeprefix("torch.")


def host_layout(mem_layout: str, io_backend: str) -> str:
    """hicache_hook.py `resolve_layout_io_compatibility`: page_first cannot use direct IO."""
    return (
        "page_first_direct" if (mem_layout, io_backend) == ("page_first", "direct") else mem_layout
    )


def gpu_free_bytes(state_dir: Path | None, gpu_index: int, total: int, mine: int) -> int:
    """What torch.cuda.mem_get_info would say: the simulated GPU's free bytes right now."""
    gpu = None
    if state_dir is not None:
        gpu = next((g for g in gpu_state.read_gpus(state_dir) if g.index == gpu_index), None)
    if state_dir is None or gpu is None:
        return total - gpu_state.DEFAULT_BASELINE_USED_BYTES - mine
    held = sum(h.used_bytes for h in gpu_state.read_holdings(state_dir) if h.gpu_index == gpu_index)
    return gpu.total_bytes - gpu.baseline_used_bytes - held


def load_begin(free: int) -> str:
    return f"Load weight begin. avail mem={free / GIB:.2f} GB"


def load_end(plan: MemoryPlan, elapsed_s: float, free: int) -> str:
    quant = f"{plan.quant}, " if plan.quant else ""
    return (
        f"Load weight end. elapsed={elapsed_s:.2f} s, type={plan.architecture}, {quant}"
        f"avail mem={free / GIB:.2f} GB, mem usage={plan.weights_bytes / GIB:.2f} GB."
    )


def kv_allocated(plan: MemoryPlan) -> str:
    head = f"KV Cache is allocated. dtype: {plan.kv_dtype}, #tokens: {plan.device_tokens}, "
    sizes = plan.kv_sizes()
    if len(sizes) == 2:
        return head + f"K size: {sizes[0] / GIB:.2f} GB, V size: {sizes[1] / GIB:.2f} GB"
    return head + f"KV size: {sizes[0] / GIB:.2f} GB"


def kv_allocated_lines(plan: MemoryPlan) -> list[str]:
    """Every device pool's line in SGLang's order: a Mamba hybrid's state pool before its KV
    pool (the request pool is built first), a sliding-window model's Full then SWA pool and the
    pair's total (mem_cache/swa_memory_pool.py `SWAKVPool.__init__`)."""
    if not plan.pools:
        return [kv_allocated(plan)]
    lines = []
    for pool in plan.pools:
        rows = pool.size + pool.pad
        if pool.label == "Mamba":  # mem_cache/memory_pool.py `MambaPool.__init__`, no spec
            lines.append(
                f"Mamba Cache is allocated. max_mamba_cache_size: {pool.size}, "
                f"conv_state size: {rows * pool.k_row / GIB:.2f}GB, "
                f"ssm_state size: {rows * pool.v_row / GIB:.2f}GB "
            )
            continue
        name = f"{pool.label} KV Cache" if pool.label else "KV Cache"
        lines.append(
            f"{name} is allocated. dtype: {plan.kv_dtype}, #tokens: {pool.size}, "
            f"K size: {rows * pool.k_row / GIB:.2f} GB, V size: {rows * pool.v_row / GIB:.2f} GB"
        )
    sizes = {p.label: p for p in plan.pools}
    if "SWA" in sizes:
        total = sizes["Full"].device_bytes + sizes["SWA"].device_bytes
        lines.append(
            f"SWAKVPool mem usage: {total / GIB:.2f} GB, swa size: {sizes['SWA'].size}, "
            f"full size: {sizes['Full'].size}"
        )
    return lines


def pool_end(free: int) -> str:
    return f"Memory pool end. avail mem={free / GIB:.2f} GB"


def _smaller(name: str, host: int, device: int) -> str:
    """pool_host/base.py names the pool ("HiCache full host pool"), pool_host/mamba.py says
    "HiCache host KV pool"."""
    return (
        f"HiCache {name} ({host} tokens) is smaller than the device pool "
        f"({device} tokens);L2 cache effectiveness is reduced.Consider increasing "
        "--hicache-ratio (or --hicache-size) for higher L2 cache hit rate."
    )


def hybrid_host_lines(plan: MemoryPlan) -> list[str]:
    """A hybrid model's host pools, KV pools first (hybrid_pool_assembler.py builds the Mamba
    host pool after the KV one): pool_host/base.py `_allocate_host_buffer`, pool_host/mamba.py."""
    lines = []
    for pool in sorted(plan.pools, key=lambda p: p.label == "Mamba"):
        if pool.label == "Mamba":
            if pool.host_size <= pool.size:
                lines.append(_smaller("host KV pool", pool.host_size, pool.size))
            layout = (
                "page_first_direct"
                if plan.host_layout == "page_first_kv_split"
                else plan.host_layout
            )
            lines.append(
                f"Allocating {pool.host_size * pool.row / 1e9:.2f} GB host memory for "
                f"hierarchical Mamba cache ({pool.host_size} state slots, layout={layout})."
            )
            continue
        if pool.host_size <= pool.size:
            lines.append(_smaller(f"{pool.host_label} host pool", pool.host_size, pool.size))
        lines.append(
            f"Allocating {pool.host_label} hierarchical KV host pool: {pool.host_size} tokens, "
            f"{pool.host_size * pool.row / 1e9:.2f} GB host memory."
        )
    return lines


def host_pool_lines(plan: MemoryPlan) -> list[str]:
    """The host pool's lines, in order (none without a host pool)."""
    if plan.host_tokens <= 0:
        return []
    if plan.pools:
        return hybrid_host_lines(plan)
    lines: list[str] = []
    if plan.host_tokens <= plan.device_tokens:
        lines.append(
            f"HiCache kv host pool ({plan.host_tokens} tokens) is smaller than the device pool "
            f"({plan.device_tokens} tokens);L2 cache effectiveness is reduced.Consider increasing "
            "--hicache-ratio (or --hicache-size) for higher L2 cache hit rate."
        )
    row = plan.k_per_token + plan.v_per_token
    lines.append(
        f"Allocating kv hierarchical KV host pool: {plan.host_tokens} tokens, "
        f"{plan.host_tokens * row / 1e9:.2f} GB host memory."
    )
    if plan.kind == "DSA":
        lines.append(
            f"Allocating {plan.host_tokens * plan.indexer_per_token / 1e9:.2f} GB host memory "
            f"for DSA indexer (layout={plan.host_layout})."
        )
    return lines
