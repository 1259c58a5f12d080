"""Host-side assessment: the host pool in its mode, the budget term by term, host and NUMA checks.

Pure: takes the plan, the KV cell, the device pool and the budget; returns numbers and checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.core import fit
from supervisor.core.checks import Check, SglangRules, Status, Term
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GB, format_gb


@dataclass(frozen=True, slots=True, kw_only=True)
class HostAssessment:
    """What the host side concluded."""

    mode: str  # off | size | ratio | auto
    ratio: float | None
    pool_tokens: int | None  # None: could not be sized (ratio mode, device pool unknown)
    pool_bytes: int | None
    required_bytes: int | None
    terms: tuple[Term, ...]
    checks: tuple[Check, ...]
    max_hicache_size_gb: int
    safe_host_tokens: int


def assess_host(
    *,
    plan: LaunchPlan,
    bytes_per_token: int,
    indexer_bytes_per_token: int,
    device_tokens: int | None,
    budget: fit.HostBudget,
    numa: Sequence[fit.NumaLoad],
    rules: SglangRules,
    cgroup_limited: bool,
) -> HostAssessment:
    """Size the host pool the way SGLang will and check it against the host and NUMA budgets."""
    bpt, idx = bytes_per_token, indexer_bytes_per_token
    local_ranks = plan.local_ranks
    checks: list[Check] = []
    mode = plan.hicache_mode if plan.uses_hicache else "off"
    ratio: float | None = None
    auto_ratio: float | None = None
    if mode == "ratio":
        ratio = plan.hicache_ratio
    elif mode == "auto":
        ratio = fit.default_hicache_ratio(plan)
        if rules.auto_sizing and device_tokens:
            auto_ratio = fit.estimate_auto_ratio(
                usable_bytes=budget.usable_bytes,
                ranks_per_host=plan.tp_size * plan.pp_size // plan.nnodes,
                host_memory_fraction=plan.hicache_host_memory_fraction,
                device_tokens=device_tokens,
                bytes_per_token=bpt + idx,
            )
            ratio = max(0.0, auto_ratio)
    pool_tokens: int | None
    pool_bytes: int | None
    try:
        pool_tokens = fit.host_pool_tokens(plan, bpt, device_tokens, auto_ratio=ratio)
        pool_bytes = pool_tokens * (bpt + idx)
    except fit.DeviceTokensUnknown as exc:
        pool_tokens = pool_bytes = None
        checks.append(Check("host_pool", Status.FAIL, f"cannot size the host pool: {exc}"))
    if auto_ratio is not None and auto_ratio <= 0:
        checks.append(
            Check(
                "host_pool",
                Status.FAIL,
                "SGLang's HiCache auto-sizing will refuse: no host memory is left for HiCache "
                "after the 10 GiB reserve",
            )
        )

    terms = [
        Term(
            label="usable (MemAvailable" + (", cgroup)" if cgroup_limited else ")"),
            bytes=budget.usable_bytes,
        ),
        Term(label="reserve", bytes=-budget.reserve_bytes),
        Term(label="main process + detokenizer", bytes=-budget.main_overhead_bytes),
        Term(
            label=f"runtime per rank × {local_ranks}",
            bytes=-budget.per_rank_overhead_bytes * local_ranks,
        ),
    ]
    if budget.cpu_offload_bytes_per_rank:
        terms.append(
            Term(
                label=f"--cpu-offload-gb × {local_ranks}",
                bytes=-budget.cpu_offload_bytes_per_rank * local_ranks,
            )
        )
    required = None
    if pool_bytes is not None:
        pools_total = pool_bytes * local_ranks
        if budget.load_transient_bytes > pools_total:
            terms.append(
                Term(label="weight-load buffers (no mmap)", bytes=-budget.load_transient_bytes)
            )
        else:
            terms.append(
                Term(
                    label=f"host KV pool {format_gb(pool_bytes)} × {local_ranks}",
                    bytes=-pools_total,
                )
            )
        required = fit.required_host_bytes(pool_bytes, local_ranks, budget)
        if required <= budget.budget_bytes:
            checks.append(
                Check(
                    "host_memory",
                    Status.OK,
                    f"needs {format_gb(required)} of {format_gb(budget.budget_bytes)} budget",
                )
            )
        else:
            checks.append(
                Check(
                    "host_memory",
                    Status.FAIL,
                    f"needs {format_gb(required)}, budget is {format_gb(budget.budget_bytes)} "
                    f"({local_ranks} ranks × {format_gb(pool_bytes)} host pool each)",
                )
            )
        for node in numa:
            need = fit.numa_required_bytes(pool_bytes, node, budget)
            ok = need <= node.available_bytes
            checks.append(
                Check(
                    f"numa_node{node.node}",
                    Status.OK if ok else Status.FAIL,
                    f"{node.ranks} rank(s) need {format_gb(need)}, node has "
                    f"{format_gb(node.available_bytes)} free",
                )
            )
        if not rules.check_divides_by_ranks and required > budget.budget_bytes:
            checks.append(
                Check(
                    "sglang_check",
                    Status.WARN,
                    f"SGLang {rules.version} checks each rank against the whole host and would "
                    "not catch this before pinning",
                )
            )
    if plan.weight_loader_disable_mmap:
        checks.append(
            Check(
                "weight_loading",
                Status.WARN,
                f"--weight-loader-disable-mmap: every rank reads shards into anonymous memory, "
                f"≈ {format_gb(budget.load_transient_bytes)} across {local_ranks} ranks "
                "while loading",
            )
        )
    safe = fit.max_hicache_size_gb(
        bytes_per_token=bpt,
        indexer_bytes_per_token=idx,
        page_size=plan.effective_page_size,
        local_ranks=local_ranks,
        budget=budget,
        numa=numa,
    )
    safe_tokens = fit.page_aligned_tokens(safe * GB // bpt, plan.effective_page_size) if safe else 0
    return HostAssessment(
        mode=mode,
        ratio=ratio,
        pool_tokens=pool_tokens,
        pool_bytes=pool_bytes,
        required_bytes=required,
        terms=tuple(terms),
        checks=tuple(checks),
        max_hicache_size_gb=safe,
        safe_host_tokens=safe_tokens,
    )
