"""The next `--hicache-size` after a memory kill (pure): current size × shrink_factor, a ratio or
auto-sized pool first converted to its size, never below `min_hicache_size`.

`--hicache-size` is whole decimal GB per rank (docs/sglang.md §1.1); giving it also overrides
`--hicache-ratio` and disables SGLang's auto-sizing (docs/sglang.md §1.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GB

DEFAULT_SHRINK_FACTOR = 0.75


@dataclass(frozen=True, slots=True, kw_only=True)
class ShrinkDecision:
    """`size_gb` None: nothing to shrink (no hierarchical cache, or its size is unknown)."""

    size_gb: int | None
    previous_gb: int | None
    reason: str
    at_minimum: bool = False


def current_hicache_gb(plan: LaunchPlan, pool_bytes_per_rank: int | None) -> int | None:
    """The host pool per rank in GB as launched: the flag, else the measured/estimated pool."""
    if not plan.uses_hicache:
        return None
    if plan.hicache_mode == "size":
        return plan.hicache_size_gb
    if pool_bytes_per_rank is None or pool_bytes_per_rank <= 0:
        return None
    return max(1, math.floor(pool_bytes_per_rank / GB))


def decide_shrink(
    plan: LaunchPlan,
    *,
    pool_bytes_per_rank: int | None = None,
    override_gb: int | None = None,
    shrink_factor: float = DEFAULT_SHRINK_FACTOR,
    min_size_gb: int = 1,
) -> ShrinkDecision:
    """The size for the relaunch after a memory kill.

    Args:
        plan: the argv as the operator gave it.
        pool_bytes_per_rank: host pool per rank in ratio/auto mode (the pre-flight's estimate or
            SGLang's "Allocating ... X GB host memory" line); converts a ratio to a size.
        override_gb: the size the killed run actually used, if an earlier shrink set one.
        shrink_factor: in (0, 1).
        min_size_gb: never go below this.
    """
    current = (
        override_gb if override_gb is not None else current_hicache_gb(plan, pool_bytes_per_rank)
    )
    if current is None:
        why = (
            "the server does not use the hierarchical cache"
            if not plan.uses_hicache
            else f"the host pool size of --hicache-{plan.hicache_mode} mode is unknown"
        )
        return ShrinkDecision(size_gb=None, previous_gb=None, reason=f"not shrinking: {why}")
    if current <= min_size_gb:
        return ShrinkDecision(
            size_gb=min_size_gb,
            previous_gb=current,
            reason=f"--hicache-size already at the minimum {min_size_gb} GB",
            at_minimum=True,
        )
    # Floor, and at least 1 GB less: 0.75 × 3 GB must not round back up to 3.
    shrunk = min(math.floor(current * shrink_factor), current - 1)
    size = max(min_size_gb, shrunk)
    return ShrinkDecision(
        size_gb=size,
        previous_gb=current,
        reason=f"memory kill: --hicache-size {current} -> {size} GB per rank "
        f"(× {shrink_factor:g}, minimum {min_size_gb} GB)",
        at_minimum=size == min_size_gb,
    )


def override_expires_at(set_at_s: float | None, expires_s: float) -> float | None:
    """When a restart-smaller override set at `set_at_s` (epoch seconds) lapses; None: never
    (`shrink_expires` off) or not known (an override from before its time was recorded)."""
    if expires_s <= 0 or set_at_s is None:
        return None
    return set_at_s + expires_s


def override_expired(set_at_s: float | None, expires_s: float, now_s: float) -> bool:
    """Whether the override is past its `[watchdog] shrink_expires`."""
    expires_at = override_expires_at(set_at_s, expires_s)
    return expires_at is not None and now_s >= expires_at
