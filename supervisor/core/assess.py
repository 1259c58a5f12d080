"""Host-side assessment: the host pool in its mode, the budget term by term, host and NUMA checks.

Pure: takes the plan, the KV cell, the device pool and the budget; returns numbers and checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.core import fit, hybrid_host
from supervisor.core.checks import Check, Status, Term
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.pools import Pool
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.sglang_versions import SglangRules
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
    fits_without_hicache: bool = True  # the host and its NUMA nodes, with no host pool at all
    pools: tuple[Pool, ...] = ()  # a hybrid model's pools with their host pools (else none)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pool:
    """The host pool per rank as SGLang will size it."""

    mode: str
    ratio: float | None
    tokens: int | None
    bytes_: int | None
    checks: tuple[Check, ...]


def _pool(
    plan: LaunchPlan,
    cell_bytes: int,
    indexer_bytes: int,
    device_tokens: int | None,
    budget: fit.HostBudget,
    rules: SglangRules,
) -> _Pool:
    """The host pool in its mode: size, ratio, or SGLang's auto-sizing (when the version has it)."""
    mode = plan.hicache_mode if plan.uses_hicache else "off"
    ratio: float | None = None
    auto_ratio: float | None = None
    if mode == "ratio":
        ratio = plan.hicache_ratio
    elif mode == "auto" and not rules.auto_sizing:
        mode, ratio = "ratio", fit.default_hicache_ratio(plan)  # a release before auto-sizing
    elif mode == "auto":
        ratio = fit.default_hicache_ratio(plan)
        if device_tokens:
            auto_ratio = fit.estimate_auto_ratio(
                usable_bytes=budget.usable_bytes,
                ranks_per_host=plan.tp_size * plan.pp_size // plan.nnodes,
                host_memory_fraction=plan.hicache_host_memory_fraction,
                device_tokens=device_tokens,
                bytes_per_token=cell_bytes + indexer_bytes,
                requested_ratio=ratio,
            )
            ratio = max(0.0, auto_ratio)
    checks: list[Check] = []
    try:
        tokens: int | None = fit.host_pool_tokens(plan, cell_bytes, device_tokens, auto_ratio=ratio)
    except fit.DeviceTokensUnknown as exc:
        tokens = None
        checks.append(Check("host_pool", Status.FAIL, f"cannot size the host pool: {exc}"))
    if auto_ratio is not None and auto_ratio <= 0:
        detail = (
            "SGLang's HiCache auto-sizing will refuse: no host memory is left for HiCache "
            "after the 10 GiB reserve"
        )
        checks.append(Check("host_pool", Status.FAIL, detail))
    pool_bytes = None if tokens is None else tokens * (cell_bytes + indexer_bytes)
    return _Pool(mode=mode, ratio=ratio, tokens=tokens, bytes_=pool_bytes, checks=tuple(checks))


def _terms(
    budget: fit.HostBudget, local_ranks: int, pool_bytes: int | None, cgroup_limited: bool
) -> tuple[Term, ...]:
    """The budget line by line, as the report's arithmetic shows it (signed bytes)."""
    terms = [
        Term(
            label="usable (MemAvailable" + (", cgroup)" if cgroup_limited else ")"),
            bytes=budget.usable_bytes,
        ),
        Term(label="reserve", bytes=-budget.reserve_bytes),
        *(
            [Term(label="other instances starting (ledger)", bytes=-budget.reserved_bytes)]
            if budget.reserved_bytes
            else []
        ),
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
    terms += [Term(label=c.label, bytes=-c.bytes) for c in budget.consumers if c.bytes]
    if pool_bytes is not None:
        pools_total = pool_bytes * local_ranks
        if budget.load_transient_bytes > pools_total:
            label, size = "weight-load buffers (no mmap)", budget.load_transient_bytes
        else:
            label, size = f"host KV pool {format_gb(pool_bytes)} × {local_ranks}", pools_total
        terms.append(Term(label=label, bytes=-size))
    return tuple(terms)


def _memory_checks(
    pool_bytes: int,
    required: int,
    local_ranks: int,
    budget: fit.HostBudget,
    numa: Sequence[fit.NumaLoad],
    rules: SglangRules,
) -> list[Check]:
    """The whole host, every NUMA node, and whether SGLang's own check would catch a no-fit."""
    allowed = budget.budget_bytes
    if required <= allowed:
        host = Check(
            "host_memory", Status.OK, f"needs {format_gb(required)} of {format_gb(allowed)} budget"
        )
    else:
        host = Check(
            "host_memory",
            Status.FAIL,
            f"needs {format_gb(required)}, budget is {format_gb(allowed)} "
            f"({local_ranks} ranks × {format_gb(pool_bytes)} host pool each)",
        )
    checks = [host]
    for node in numa:
        need = fit.numa_required_bytes(pool_bytes, node, budget)
        checks.append(
            Check(
                f"numa_node{node.node}",
                Status.OK if need <= node.available_bytes else Status.FAIL,
                f"{node.ranks} rank(s) need {format_gb(need)}, node has "
                f"{format_gb(node.available_bytes)} free",
            )
        )
    if not rules.check_divides_by_ranks and required > allowed:
        detail = (
            f"SGLang {rules.version} checks each rank against the whole host and would not "
            "catch this before pinning"
        )
        checks.append(Check("sglang_check", Status.WARN, detail))
    return checks


def _safe_size(
    plan: LaunchPlan,
    bytes_per_token: int,
    indexer_bytes_per_token: int,
    budget: fit.HostBudget,
    numa: Sequence[fit.NumaLoad],
) -> tuple[int, int]:
    """(the largest `--hicache-size` that fits, the host tokens it buys) for one pool."""
    page = plan.effective_page_size
    safe = fit.max_hicache_size_gb(
        bytes_per_token=bytes_per_token,
        indexer_bytes_per_token=indexer_bytes_per_token,
        page_size=page,
        local_ranks=plan.local_ranks,
        budget=budget,
        numa=numa,
    )
    return safe, fit.page_aligned_tokens(safe * GB // bytes_per_token, page) if safe else 0


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
    layout: HybridLayout | None = None,
    device_pools: tuple[Pool, ...] | None = None,
) -> HostAssessment:
    """Size the host pool the way SGLang will and check it against the host and NUMA budgets.

    `layout`: a hybrid model's pools (core/hybrid_geometry.py), sized beside `device_pools`
    (None: the GPU is unknown) instead of one pool of `bytes_per_token`.
    """
    local_ranks = plan.local_ranks
    side = (
        None if layout is None else hybrid_host.host_side(plan, layout, device_pools, budget, rules)
    )
    if side is None:
        pool = _pool(plan, bytes_per_token, indexer_bytes_per_token, device_tokens, budget, rules)
    else:
        pool = _Pool(
            mode=side.mode,
            ratio=side.ratio,
            tokens=side.anchor_host_tokens,
            bytes_=side.host_bytes,
            checks=side.checks,
        )
    checks = list(pool.checks)
    required = None
    if pool.bytes_ is not None:
        required = fit.required_host_bytes(pool.bytes_, local_ranks, budget)
        checks += _memory_checks(pool.bytes_, required, local_ranks, budget, numa, rules)
    if plan.weight_loader_disable_mmap:
        detail = (
            "--weight-loader-disable-mmap: every rank reads shards into anonymous memory, "
            f"≈ {format_gb(budget.load_transient_bytes)} across {local_ranks} ranks while loading"
        )
        checks.append(Check("weight_loading", Status.WARN, detail))
    if layout is None:
        safe, bought = _safe_size(plan, bytes_per_token, indexer_bytes_per_token, budget, numa)
    else:
        safe, bought = hybrid_host.safe_size(plan, layout, device_pools, budget, numa)
    return HostAssessment(
        mode=pool.mode,
        ratio=pool.ratio,
        pool_tokens=pool.tokens,
        pool_bytes=pool.bytes_,
        required_bytes=required,
        terms=_terms(budget, local_ranks, pool.bytes_, cgroup_limited),
        checks=tuple(checks),
        max_hicache_size_gb=safe,
        safe_host_tokens=bought,
        fits_without_hicache=fit.fits_host(0, local_ranks, budget, numa),
        pools=side.pools if side is not None else (),
    )
