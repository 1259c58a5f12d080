"""A hybrid model's pools per rank, on the GPU and in host memory, as SGLang 0.5.23 sizes them.

Pure arithmetic over the HybridLayout (core/hybrid_geometry.py) and the launch plan; formulas in
docs/sglang.md §1.9. Paths are under sglang/srt/.

- Sliding window: one budget pays `full_row + r × swa_row` per full-pool token, r =
  `--swa-full-tokens-ratio` (0.8); the SWA pool is r × the full pool
  (model_executor/pool_configurator.py:786-803, 859-893, 907-916).
- Mamba: r/(1 + r) of the budget goes to Mamba slots, r = `--mamba-full-memory-ratio` (0.9), each
  slot plus one padding slot; the rest to the attention layers' KV
  (mem_cache/kv_cache_configurator.py:3229-3410, pool_configurator.py:637-647).
- Host: each pool mirrors its own device pool in ratio mode; `--hicache-size` is split across
  the pools by their device bytes (mem_cache/hybrid_cache/hybrid_pool_assembler.py:239-254,
  598-605, 1318-1322); a KV host pool adds a padding page (mem_cache/pool_host/base.py:221-229),
  the Mamba one a slot (mem_cache/pool_host/mamba.py:164-174).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from supervisor.core import fit
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GB

# SGLang's fallbacks when the flags are not given: arg_groups/fields/schedule.py:150-161 and
# 220-227.
SWA_FULL_TOKENS_RATIO = 0.8
MAMBA_FULL_MEMORY_RATIO = 0.9


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """One pool of one rank: its device size and, with HiCache, its host mirror."""

    # "kv" (the one pool, or a Mamba hybrid's attention layers) | "full" | "swa" | "mamba"
    name: str
    row_bytes: int  # one token (a Mamba pool: one request's state), device and host rows alike
    device: int | None  # tokens (a Mamba pool: slots) on the GPU; None: the GPU is unknown
    pad: int  # rows the device pool allocates beyond `device` (a page; one slot for Mamba)
    host: int | None = None  # tokens or slots of the host pool; None: HiCache off, or unknown

    @property
    def unit(self) -> str:
        return "slots" if self.name == "mamba" else "tokens"

    @property
    def device_bytes(self) -> int | None:
        """What SGLang's device buffers hold (`get_kv_size_bytes`, `mem_usage_bytes`), the
        padding rows included: the weights of the `--hicache-size` split."""
        return None if self.device is None else (self.device + self.pad) * self.row_bytes

    @property
    def host_bytes(self) -> int | None:
        return None if self.host is None else self.host * self.row_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "pool": self.name,
            "unit": self.unit,
            "row_bytes": self.row_bytes,
            "device": self.device,
            "device_bytes": self.device_bytes,
            "host": self.host,
            "host_bytes": self.host_bytes,
        }


def kv_budget_bytes(
    gpu_free_bytes: int, weights_per_rank_bytes: int, mem_fraction_static: float, reserved: int
) -> int:
    """The device bytes the pools share: F × m − W − R, as for a model of one pool."""
    return int(gpu_free_bytes * mem_fraction_static) - weights_per_rank_bytes - reserved


def _align(tokens: int, page: int) -> int:
    return max(0, tokens) // page * page


def swa_pools(layout: HybridLayout, plan: LaunchPlan, full_tokens: int) -> tuple[Pool, ...]:
    """The full and SWA device pools for a full pool of `full_tokens` (the solve's or SGLang's
    own number): capped by `--max-total-tokens`, page aligned, the SWA pool r × the full one."""
    page = plan.effective_page_size
    if plan.max_total_tokens is not None:
        full_tokens = min(full_tokens, plan.max_total_tokens)
    full = _align(full_tokens, page)
    ratio = plan.swa_full_tokens_ratio or SWA_FULL_TOKENS_RATIO
    swa = _align(int(full * ratio), page)
    return (
        Pool(name="full", row_bytes=layout.full_row_bytes, device=full, pad=page),
        Pool(name="swa", row_bytes=layout.swa_row_bytes, device=swa, pad=page),
    )


def mamba_pools(
    layout: HybridLayout, plan: LaunchPlan, kv_tokens: int, slots: int
) -> tuple[Pool, ...]:
    """The Mamba state pool (SGLang logs it first) and the attention layers' KV pool."""
    page = plan.effective_page_size
    if plan.max_total_tokens is not None:
        kv_tokens = min(kv_tokens, plan.max_total_tokens)
    return (
        Pool(name="mamba", row_bytes=layout.mamba_slot_bytes, device=max(0, slots), pad=1),
        Pool(name="kv", row_bytes=layout.full_row_bytes, device=_align(kv_tokens, page), pad=page),
    )


def _mamba_slots(layout: HybridLayout, plan: LaunchPlan, budget_bytes: int) -> int:
    """`_handle_max_mamba_cache` without speculative decoding: the given cache size per DP
    shard, else the most slots (and their padding slot) that fit r/(1 + r) of the budget."""
    if plan.max_mamba_cache_size is not None:
        return plan.max_mamba_cache_size // max(1, plan.tp_size // plan.attention_tp_size)
    ratio = plan.mamba_full_memory_ratio or MAMBA_FULL_MEMORY_RATIO
    slot = layout.mamba_slot_bytes
    share = budget_bytes * ratio / (1 + ratio)
    return int((share - slot) // slot)


def device_pools(layout: HybridLayout, plan: LaunchPlan, budget_bytes: int) -> tuple[Pool, ...]:
    """The device pools one rank builds from `budget_bytes` (F × m − W − R)."""
    if budget_bytes <= 0:
        budget_bytes = 0
    if layout.kind == "swa":
        ratio = plan.swa_full_tokens_ratio or SWA_FULL_TOKENS_RATIO
        cell = layout.full_row_bytes + ratio * layout.swa_row_bytes
        return swa_pools(layout, plan, int(budget_bytes // cell))
    slots = _mamba_slots(layout, plan, budget_bytes)
    rest = budget_bytes - (max(0, slots) + 1) * layout.mamba_slot_bytes
    tokens = rest // layout.full_row_bytes if rest > 0 and layout.full_row_bytes else 0
    return mamba_pools(layout, plan, tokens, slots)


def device_problem(layout: HybridLayout, plan: LaunchPlan, pools: Sequence[Pool]) -> str | None:
    """Why SGLang would refuse these device pools at start, or None."""
    sizes = {p.name: p.device for p in pools if p.device is not None}
    if sizes.get("mamba", 1) <= 0:
        return "no GPU memory is left for the Mamba state cache (SGLang stops at start)"
    swa, window = sizes.get("swa"), layout.window_tokens
    if swa is not None and window is not None and window + plan.effective_page_size >= swa:
        # model_executor/pool_configurator.py:198-222 validate_swa_pool_size
        return (
            f"the SWA pool ({swa:,} tokens) cannot hold one request of the "
            f"{window}-token window: SGLang stops at start"
        )
    return None


def nominal_device_pools(layout: HybridLayout, plan: LaunchPlan) -> tuple[Pool, ...]:
    """Pools in the proportions SGLang's solve gives them, for splitting `--hicache-size` when
    the GPU is unknown (a budget of 1 TB: padding rows then weigh nothing)."""
    return device_pools(layout, plan, 1000 * GB)


def size_shares_gb(size_gb: int, device: Sequence[Pool]) -> tuple[float, ...]:
    """`_split_hicache_size`: each pool's part of `--hicache-size`, by its device bytes."""
    sizes = [p.device_bytes or 0 for p in device]
    total = sum(sizes)
    if total <= 0:
        return tuple(0.0 for _ in device)
    return tuple(size_gb * size / total for size in sizes)


def _host_rows(pool: Pool, raw: int, page: int) -> int:
    """Whole pages plus a padding page (KV), or one padding slot (Mamba, whose page is 1)."""
    if pool.name == "mamba":
        return max(0, raw) + 1
    return fit.page_aligned_tokens(raw, page)


def host_pools(plan: LaunchPlan, device: Sequence[Pool], ratio: float) -> tuple[Pool, ...]:
    """The device pools with their host pools: split `--hicache-size`, else `ratio` × each."""
    page = plan.effective_page_size
    if plan.hicache_mode == "size":
        shares = size_shares_gb(plan.hicache_size_gb, device)
        raws = [int(share * 1e9 // p.row_bytes) for share, p in zip(shares, device, strict=True)]
    else:
        raws = [int((p.device or 0) * ratio) for p in device]
    return tuple(
        replace(p, host=_host_rows(p, raw, page)) for p, raw in zip(device, raws, strict=True)
    )


def host_bytes_at_size(plan: LaunchPlan, device: Sequence[Pool], size_gb: int) -> int:
    """Host bytes per rank that `--hicache-size size_gb` allocates across the pools."""
    if size_gb <= 0:
        return 0
    sized = host_pools(replace(plan, hicache_size_gb=size_gb), device, 0.0)
    return sum(p.host_bytes or 0 for p in sized)


def anchor(pools: Sequence[Pool]) -> Pool:
    """The pool whose tokens are the cache's (the full pool, or the Mamba hybrid's KV pool)."""
    return next(p for p in pools if p.name in ("full", "kv"))


def one_pool(
    *,
    cell_bytes: int,
    indexer_bytes: int,
    device_tokens: int | None,
    host_tokens: int | None,
    page: int,
) -> tuple[Pool, ...]:
    """A model of one pool, as the report lists pools: the KV pool, and beside it a DSA
    model's indexer pool, which mirrors its tokens (its host pool is a pool of its own)."""
    kv = Pool(name="kv", row_bytes=cell_bytes, device=device_tokens, pad=page, host=host_tokens)
    if not indexer_bytes:
        return (kv,)
    return (kv, replace(kv, name="indexer", row_bytes=indexer_bytes))
