"""Fit arithmetic: device KV tokens, host pool per rank, host and NUMA totals, the safe size.

Pure functions over integers (bytes, tokens) and the LaunchPlan; formulas in docs/sglang.md §1.
`--hicache-size` is decimal GB per rank; SGLang's reserve is 10 GiB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from supervisor.core.host_consumers import Consumer
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GB, GiB, MiB

# `--hicache-ratio` unset: 2.0 in `cache` mode (the default), 1.2 in `buffer_only`
# (SGLang arg_groups/hicache_hook.py, docs/sglang.md §1.1).
DEFAULT_RATIO_CACHE = 2.0
DEFAULT_RATIO_BUFFER_ONLY = 1.2
# SGLang's HICACHE_HOST_MEMORY_RESERVE_BYTES (docs/sglang.md §1.6).
SGLANG_HOST_RESERVE_BYTES = 10 * GiB
# Auto-sizing (PR #40135) spends 95 % of its per-rank budget and never exceeds the mode's default.
_AUTO_SIZE_HEADROOM = 0.95
# mem_fraction_static when the GPU memory is unknown (docs/sglang.md §1.4).
DEFAULT_MEM_FRACTION_UNKNOWN_GPU = 0.95


class DeviceTokensUnknown(ValueError):
    """Ratio mode needs the device pool size, and no GPU memory was read or given."""


def default_hicache_ratio(plan: LaunchPlan) -> float:
    """The ratio SGLang uses when `--hicache-ratio` is not given."""
    if plan.hicache_host_memory_mode == "buffer_only":
        return DEFAULT_RATIO_BUFFER_ONLY
    return DEFAULT_RATIO_CACHE


def page_aligned_tokens(tokens: int, page_size: int) -> int:
    """SGLang's host pool rounds down to whole pages and adds one padding page."""
    page_size = max(1, page_size)  # the argv reader refuses 0; never divide by it regardless
    return (max(0, tokens) // page_size + 1) * page_size


def host_pool_tokens(
    plan: LaunchPlan,
    bytes_per_token: int,
    device_tokens: int | None,
    *,
    auto_ratio: float | None = None,
) -> int:
    """Tokens of one rank's host pool, page aligned (0 when HiCache is off).

    Size mode: `hicache_size_gb · 1e9 // bytes_per_token`. Ratio mode: `int(device_tokens · R)`
    with R = `--hicache-ratio`, else `auto_ratio` (SGLang's auto-sizing, computed by the caller
    with `estimate_auto_ratio`), else the default ratio (2.0 cache / 1.2 buffer_only).

    Raises:
        DeviceTokensUnknown: ratio mode and `device_tokens` is None (GPU memory unknown).
    """
    if not plan.uses_hicache:
        return 0
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be positive")
    if plan.hicache_mode == "size":
        raw = plan.hicache_size_gb * GB // bytes_per_token
    else:
        if plan.hicache_mode == "ratio" and plan.hicache_ratio is not None:
            ratio = plan.hicache_ratio
        elif auto_ratio is not None:
            ratio = auto_ratio
        else:
            ratio = default_hicache_ratio(plan)
        if device_tokens is None:
            raise DeviceTokensUnknown(
                f"the host pool is sized as {ratio:g} × the device KV pool, and the device pool "
                "is unknown: give --gpus and --gpu-memory (or [host] gpus/gpu_memory), or pass "
                "an explicit --hicache-size"
            )
        raw = int(device_tokens * ratio)
    return page_aligned_tokens(raw, plan.effective_page_size)


def host_pool_bytes_per_rank(
    plan: LaunchPlan,
    bytes_per_token: int,
    device_tokens: int | None,
    indexer_bytes_per_token: int = 0,
    *,
    auto_ratio: float | None = None,
) -> int:
    """Pinned host bytes one rank allocates: KV pool plus the DSA indexer pool (same tokens).

    Raises:
        DeviceTokensUnknown: ratio mode and `device_tokens` is None.
    """
    tokens = host_pool_tokens(plan, bytes_per_token, device_tokens, auto_ratio=auto_ratio)
    return tokens * (bytes_per_token + indexer_bytes_per_token)


def size_mode_pool_bytes(
    size_gb: int, bytes_per_token: int, indexer_bytes_per_token: int, page_size: int
) -> int:
    """Host bytes per rank that `--hicache-size size_gb` allocates (0 for size 0)."""
    if size_gb <= 0 or bytes_per_token <= 0:
        return 0
    tokens = page_aligned_tokens(size_gb * GB // bytes_per_token, page_size)
    return tokens * (bytes_per_token + indexer_bytes_per_token)


def prefill_graph_sizes(max_tokens: int) -> int:
    """How many prefill CUDA graphs SGLang captures up to `max_tokens` (cuda_graph_hook.py):
    every 4 tokens to 32, 16 to 256, 32 to 512, 64 to 1024, 256 to 4096, then 512."""
    steps = ((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256))
    count = sum(len(range(lo, min(hi, max_tokens) + 1, step)) for lo, hi, step in steps)
    return count + len(range(4608, max_tokens + 1, 512))


def auto_mem_fraction_static(gpu_total_bytes: int, plan: LaunchPlan, *, mla: bool) -> float:
    """SGLang's automatic `--mem-fraction-static` for the smallest GPU (docs/sglang.md §1.4).

    0.0 when the GPU is smaller than what SGLang reserves on it (no KV pool at all): the edge
    refuses a GPU below 1 GiB, but core answers for any input, zero included.
    """
    if gpu_total_bytes <= 0:
        return 0.0
    gpu_mb = gpu_total_bytes / MiB
    gpu_gib = gpu_total_bytes / GiB
    tp_ge_4 = plan.tp_size >= 4
    if gpu_gib < 20:
        chunked, max_bs = 2048, 8
    elif gpu_gib < 35:
        chunked, max_bs = 4096, 160 if tp_ge_4 else 48
    elif gpu_gib < 60:
        chunked, max_bs = 4096, 160 if tp_ge_4 else 32
    elif gpu_gib < 160:
        chunked, max_bs = 8192, 512 if tp_ge_4 else 256
    else:
        chunked, max_bs = 16384, 512
    activation_tokens = max(chunked, 2048)
    attn_dp = plan.attn_dp_size if plan.attn_dp_size > 1 else 1
    if plan.enable_dp_attention and attn_dp == 1:
        attn_dp = plan.dp_size
    graph_mb = 2.0 * max_bs
    if attn_dp > 1:
        graph_mb += 3 * max_bs * attn_dp + (1.5 * max_bs * attn_dp if max_bs > 300 else 0)
    # Prefill CUDA graphs: 8 MB per captured size up to the chunk (non-MLA); 1.5 GB for MLA.
    graph_mb += 1536 if mla else 8 * prefill_graph_sizes(chunked)
    reserved_mb = 512 + 1.5 * activation_tokens + (plan.tp_size * plan.pp_size / 8) * 1024
    reserved_mb += graph_mb
    if gpu_gib > 60:
        reserved_mb = max(reserved_mb, 10240)
    return max(0.0, round((gpu_mb - reserved_mb) / gpu_mb, 3))


def estimate_device_tokens(
    *,
    gpu_free_bytes: int,
    weights_per_rank_bytes: int,
    mem_fraction_static: float,
    bytes_per_token: int,
    page_size: int,
    max_total_tokens: int | None,
    reserved_bytes: int = 0,
) -> int:
    """Device KV tokens per rank: (F·m − W − R) / cell, floored to pages, capped
    (docs/sglang.md §1.4); R is what SGLang holds back for multimodal models.

    Returns 0 when the weights leave no room ("Loaded weights leave no GPU memory for the KV
    cache"), which the caller reports as a failed check.
    """
    rest = int(gpu_free_bytes * mem_fraction_static) - weights_per_rank_bytes - reserved_bytes
    if rest <= 0 or bytes_per_token <= 0:
        return 0
    page_size = max(1, page_size)
    tokens = rest // bytes_per_token // page_size * page_size
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return tokens


def estimate_auto_ratio(
    *,
    usable_bytes: int,
    ranks_per_host: int,
    host_memory_fraction: float,
    device_tokens: int,
    bytes_per_token: int,
    requested_ratio: float,
) -> float:
    """The ratio SGLang's HiCache auto-sizing picks (docs/sglang.md §1.5); ≤ 0: it raises.

    `requested_ratio` is the default ratio of the mode (`default_hicache_ratio`): auto-sizing
    only ever lowers it (mem_cache/hicache_auto_size.py `auto_size_hicache`).
    """
    budget = int((usable_bytes - SGLANG_HOST_RESERVE_BYTES) // max(1, ranks_per_host))
    budget_f = int(budget * host_memory_fraction)
    device_bytes = device_tokens * bytes_per_token
    if device_bytes <= 0:
        return 0.0
    return min(requested_ratio, budget_f * _AUTO_SIZE_HEADROOM / device_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostBudget:
    """Host memory the launch may use, and what it needs besides the KV pools."""

    usable_bytes: int  # min(MemAvailable, cgroup headroom)
    reserve_bytes: int
    per_rank_overhead_bytes: int
    main_overhead_bytes: int
    load_transient_bytes: int = 0  # node-wide anonymous load buffers (--weight-loader-disable-mmap)
    cpu_offload_bytes_per_rank: int = 0  # --cpu-offload-gb keeps that much weight in host RAM
    # Planned by other instances starting on this host and not yet pinned (the ledger):
    # MemAvailable does not show it yet.
    reserved_bytes: int = 0
    # SGLang's opt-in host consumers beside the pools (core/host_consumers.py), steady state.
    consumers: tuple[Consumer, ...] = ()

    @property
    def budget_bytes(self) -> int:
        """What the launch may use: usable minus the reserve and the other instances' claims."""
        return self.usable_bytes - self.reserve_bytes - self.reserved_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class NumaLoad:
    """One NUMA node: its free memory and how many local ranks have their GPU on it."""

    node: int
    available_bytes: int
    ranks: int


def required_host_bytes(pool_bytes_per_rank: int, local_ranks: int, budget: HostBudget) -> int:
    """Peak host memory of the launch: max(load phase, pools + steady state) (docs/sglang.md §5).

    Pools are allocated after the weights are on the GPU, so the load transient and the pools
    do not overlap; the per-rank runtime and the main process are there in both phases.
    """
    runtime = local_ranks * (budget.per_rank_overhead_bytes + budget.cpu_offload_bytes_per_rank)
    runtime += budget.main_overhead_bytes + sum(c.bytes for c in budget.consumers)
    return runtime + max(budget.load_transient_bytes, local_ranks * pool_bytes_per_rank)


def numa_required_bytes(pool_bytes_per_rank: int, node: NumaLoad, budget: HostBudget) -> int:
    """What the ranks bound to `node` need there: pools plus their runtime (docs/sglang.md §1.8)."""
    per_rank = (
        pool_bytes_per_rank + budget.per_rank_overhead_bytes + budget.cpu_offload_bytes_per_rank
    )
    per_rank += sum(c.each_bytes for c in budget.consumers if c.per_rank)
    return node.ranks * per_rank


def fits_host(
    pool_bytes_per_rank: int,
    local_ranks: int,
    budget: HostBudget,
    numa: Sequence[NumaLoad] = (),
) -> bool:
    """True when the whole host and every NUMA node have room for the pools."""
    if required_host_bytes(pool_bytes_per_rank, local_ranks, budget) > budget.budget_bytes:
        return False
    return all(
        numa_required_bytes(pool_bytes_per_rank, node, budget) <= node.available_bytes
        for node in numa
    )


def max_hicache_size_gb(
    *,
    bytes_per_token: int,
    indexer_bytes_per_token: int,
    page_size: int,
    local_ranks: int,
    budget: HostBudget,
    numa: Sequence[NumaLoad] = (),
) -> int:
    """The largest integer `--hicache-size` (GB per rank) that fits; 0 when not even 1 GB fits.

    Note that `--hicache-size 0` means "use the ratio" to SGLang, so 0 is not a usable value.
    """

    def fits(size_gb: int) -> bool:
        pool = size_mode_pool_bytes(size_gb, bytes_per_token, indexer_bytes_per_token, page_size)
        return fits_host(pool, local_ranks, budget, numa)

    # A pool of that many GB exceeds all usable memory on its own, so it never fits.
    return largest_fitting_gb(fits, budget.usable_bytes // GB + 2)


def largest_fitting_gb(fits: Callable[[int], bool], ceiling_gb: int) -> int:
    """The largest integer GB that `fits`, 0 when not even 1 GB does (a bisection: `fits` is
    monotone, and nothing at `ceiling_gb` fits)."""
    if not fits(1):
        return 0
    low, high = 1, max(2, ceiling_gb)
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low
