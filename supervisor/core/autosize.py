"""`--auto-size` (pure): whether a launch the pre-flight refused may go ahead with a smaller
`--hicache-size`, and which.

It only ever lowers the host pool, and only when everything that failed is host memory (the
budget, the pool's own sizing, a NUMA node): a port in use, a GPU already held or a TP that
cannot split the heads are not fixed by a smaller cache, and the refusal must name them.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.core.checks import Check, FitReport, Status
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.shrink import current_hicache_gb

# The checks a smaller host pool can turn from FAIL to OK.
_MEMORY_CHECKS = frozenset({"host_memory", "host_pool"})
_MEMORY_PREFIXES = ("numa_node",)


def is_memory_check(check: Check) -> bool:
    return check.name in _MEMORY_CHECKS or check.name.startswith(_MEMORY_PREFIXES)


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoSize:
    """`size_gb` None: auto-size cannot help; `reason` says why, for the refusal."""

    size_gb: int | None
    reason: str


def decide_auto_size(report: FitReport, plan: LaunchPlan) -> AutoSize:
    failed = [c for c in report.checks if c.status is Status.FAIL]
    other = [c for c in failed if not is_memory_check(c)]
    if other:
        names = ", ".join(f"{c.name} ({c.detail})" for c in other)
        return AutoSize(size_gb=None, reason=f"a smaller --hicache-size cannot fix {names}")
    if not plan.uses_hicache:
        return AutoSize(size_gb=None, reason="HiCache is off: there is no host pool to shrink")
    safe_gb = report.max_hicache_size_gb
    if safe_gb <= 0:
        return AutoSize(size_gb=None, reason="not even --hicache-size 1 fits")
    current_gb = current_hicache_gb(plan, report.host_pool_bytes_per_rank)
    if current_gb is not None and safe_gb >= current_gb:
        return AutoSize(
            size_gb=None,
            reason=(
                f"the largest safe --hicache-size ({safe_gb} GB) is not below the launch's "
                f"({current_gb} GB): the host pool is not what does not fit"
            ),
        )
    return AutoSize(size_gb=safe_gb, reason=f"--hicache-size {safe_gb} fits")
