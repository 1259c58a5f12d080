"""The host side of a hybrid model: each pool's host pool in its HiCache mode, and the largest
`--hicache-size` whose split across the pools fits (docs/sglang.md §1.9).

Pure: the plan, the layout, the device pools (None: the GPU is unknown) and the budget in;
pools, checks and sizes out. core/assess.py uses it in place of the one-pool arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from supervisor.core import fit, pools
from supervisor.core.checks import Check, Status
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.pools import Pool
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.sglang_versions import SglangRules
from supervisor.core.units import GB


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridHost:
    """Each pool with its host pool, and what they add up to per rank."""

    mode: str  # off | size | ratio | auto
    ratio: float | None
    pools: tuple[Pool, ...]  # host None: HiCache off, or not sized (the device is unknown)
    host_bytes: int | None  # all host pools of a rank; None: not sized
    anchor_host_tokens: int | None  # the full (or KV) pool's host tokens: what the cache holds
    checks: tuple[Check, ...]


def _unknown_device(pooled: Sequence[Pool]) -> tuple[Pool, ...]:
    return tuple(replace(p, device=None) for p in pooled)


def _ratio(
    plan: LaunchPlan,
    device: Sequence[Pool] | None,
    budget: fit.HostBudget,
    rules: SglangRules,
) -> tuple[str, float | None, list[Check]]:
    """(mode, ratio, checks): size, an explicit ratio, or SGLang's auto-sizing, whose device
    bytes are every pool's (mem_cache/hicache_auto_size.py:44-79 `_estimate_hicache_bytes`)."""
    mode = plan.hicache_mode if plan.uses_hicache else "off"
    if mode in ("off", "size"):
        return mode, None, []
    if mode == "ratio":
        return mode, plan.hicache_ratio, []
    ratio = fit.default_hicache_ratio(plan)
    if not rules.auto_sizing:
        return "ratio", ratio, []  # a release before auto-sizing
    if not device:
        return mode, ratio, []
    device_bytes = sum(p.device_bytes or 0 for p in device)
    auto = fit.estimate_auto_ratio(
        usable_bytes=budget.usable_bytes,
        ranks_per_host=plan.tp_size * plan.pp_size // plan.nnodes,
        host_memory_fraction=plan.hicache_host_memory_fraction,
        device_tokens=device_bytes,  # one "token" a byte: the pools' rows differ
        bytes_per_token=1,
        requested_ratio=ratio,
    )
    checks = []
    if auto <= 0:
        detail = (
            "SGLang's HiCache auto-sizing will refuse: no host memory is left for HiCache "
            "after the 10 GiB reserve"
        )
        checks.append(Check("host_pool", Status.FAIL, detail))
    return mode, max(0.0, auto), checks


def host_side(
    plan: LaunchPlan,
    layout: HybridLayout,
    device: Sequence[Pool] | None,
    budget: fit.HostBudget,
    rules: SglangRules,
) -> HybridHost:
    """The host pools SGLang builds beside `device` (None: the GPU is unknown, so only size
    mode can be sized, split as SGLang's solve would split the pools)."""
    mode, ratio, checks = _ratio(plan, device, budget, rules)
    known = tuple(device) if device else None
    shown = known or _unknown_device(pools.nominal_device_pools(layout, plan))
    if mode == "off":
        return HybridHost(
            mode=mode, ratio=None, pools=shown, host_bytes=0, anchor_host_tokens=0, checks=()
        )
    if mode == "size":
        sized = pools.host_pools(plan, known or pools.nominal_device_pools(layout, plan), 0.0)
        sized = sized if known else _unknown_device(sized)
    elif known is None:
        detail = (
            f"cannot size the host pools: they are sized as {ratio:g} × each device pool, and "
            "the device pools are unknown: give --gpus and --gpu-memory (or [host] "
            "gpus/gpu_memory), or pass an explicit --hicache-size"
        )
        checks.append(Check("host_pool", Status.FAIL, detail))
        return HybridHost(
            mode=mode,
            ratio=ratio,
            pools=shown,
            host_bytes=None,
            anchor_host_tokens=None,
            checks=tuple(checks),
        )
    else:
        sized = pools.host_pools(plan, known, ratio or 0.0)
    return HybridHost(
        mode=mode,
        ratio=ratio,
        pools=sized,
        host_bytes=sum(p.host_bytes or 0 for p in sized),
        anchor_host_tokens=pools.anchor(sized).host,
        checks=tuple(checks),
    )


def safe_size(
    plan: LaunchPlan,
    layout: HybridLayout,
    device: Sequence[Pool] | None,
    budget: fit.HostBudget,
    numa: Sequence[fit.NumaLoad],
) -> tuple[int, int]:
    """(the largest `--hicache-size` that fits, the full pool's host tokens it buys); (0, 0)
    when not even 1 GB fits."""
    split = tuple(device) if device else pools.nominal_device_pools(layout, plan)
    local_ranks = plan.local_ranks

    def fits(size_gb: int) -> bool:
        pooled = pools.host_bytes_at_size(plan, split, size_gb)
        return fit.fits_host(pooled, local_ranks, budget, numa)

    # A pool of this many GB exceeds all usable memory on its own, so it never fits.
    safe = fit.largest_fitting_gb(fits, budget.usable_bytes // GB + 2)
    if not safe:
        return 0, 0
    bought = pools.host_pools(replace(plan, hicache_size_gb=safe), split, 0.0)
    return safe, pools.anchor(bought).host or 0
