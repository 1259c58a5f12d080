"""Host-pool sizing, the host budget, NUMA nodes and the largest safe --hicache-size."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core import fit
from supervisor.core.checks import (
    Check,
    FitReport,
    Status,
    check_gpu_holders,
    check_hugepages,
    check_memlock,
    check_shm,
)
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.shm_space import ShmNeed, ShmSpace
from supervisor.core.units import GB, GiB, MiB

MLA_CELL = 70_272  # Kimi-K2.5 / DeepSeek-V3, bf16, any TP


def plan(*args: str):
    return parse_launch_args(["--model-path", "m", *args])


def seed_budget(usable_bytes: int = 445 * GB) -> fit.HostBudget:
    """The seed box's budget with PreflightConfig's defaults (10 GiB, 4 GiB/rank, 6 GiB main)."""
    return fit.HostBudget(
        usable_bytes=usable_bytes,
        reserve_bytes=10 * GiB,
        per_rank_overhead_bytes=4 * GiB,
        main_overhead_bytes=6 * GiB,
    )


def seed_fits(size_gb: int) -> bool:
    p = plan("--tp", "8", "--enable-hicache", "--hicache-size", str(size_gb))
    pool = fit.host_pool_bytes_per_rank(p, MLA_CELL, None)
    return fit.fits_host(pool, p.local_ranks, seed_budget())


# --- the seed box --------------------------------------------------------------------------


def test_seed_box_refuses_300_gb_per_rank():
    assert not seed_fits(300)


def test_seed_box_suggests_a_size_between_45_and_50_and_48_fits():
    safe = fit.max_hicache_size_gb(
        bytes_per_token=MLA_CELL,
        indexer_bytes_per_token=0,
        page_size=1,
        local_ranks=8,
        budget=seed_budget(),
    )
    assert 45 <= safe <= 50
    assert seed_fits(48)
    assert seed_fits(safe)
    assert not seed_fits(safe + 1)


# --- host pool per rank --------------------------------------------------------------------


def test_size_mode_floors_to_pages_and_adds_one_padding_page():
    p = plan("--enable-hicache", "--hicache-size", "1", "--page-size", "64")
    tokens = GB // 1000 // 64 * 64 + 64
    assert fit.host_pool_tokens(p, 1000, None) == tokens
    assert fit.host_pool_bytes_per_rank(p, 1000, None) == tokens * 1000


def test_size_mode_wins_over_ratio_and_needs_no_device_tokens():
    p = plan("--enable-hicache", "--hicache-size", "2", "--hicache-ratio", "3")
    assert fit.host_pool_tokens(p, 2000, None) == 2 * GB // 2000 + 1


def test_ratio_mode_multiplies_the_device_pool():
    p = plan("--enable-hicache", "--hicache-ratio", "1.5")
    assert fit.host_pool_tokens(p, 100, 1000) == 1501


def test_default_ratio_is_2_in_cache_mode_and_1_2_in_buffer_only():
    assert fit.host_pool_tokens(plan("--enable-hicache"), 100, 1000) == 2001
    buffer_only = plan("--enable-hicache", "--hicache-host-memory-mode", "buffer_only")
    assert fit.host_pool_tokens(buffer_only, 100, 1000) == 1201


def test_an_auto_ratio_from_the_caller_replaces_the_default():
    assert fit.host_pool_tokens(plan("--enable-hicache"), 100, 1000, auto_ratio=0.5) == 501


def test_ratio_mode_without_device_tokens_says_what_to_give():
    with pytest.raises(fit.DeviceTokensUnknown, match="--gpu-memory"):
        fit.host_pool_bytes_per_rank(plan("--enable-hicache", "--hicache-ratio", "2"), 100, None)


def test_dsa_indexer_pool_is_added_on_top_of_the_size_budget():
    p = plan("--enable-hicache", "--hicache-size", "1")
    tokens = GB // 70_272 + 1
    assert fit.host_pool_bytes_per_rank(p, 70_272, None, 8_052) == tokens * (70_272 + 8_052)


def test_no_hicache_means_no_host_pool():
    assert fit.host_pool_bytes_per_rank(plan("--hicache-size", "300"), MLA_CELL, None) == 0


# --- ranks, budget, NUMA -------------------------------------------------------------------


def test_dp_size_2_doubles_the_local_ranks_and_the_pools():
    one = plan("--tp", "8", "--enable-hicache", "--hicache-size", "40")
    two = plan("--tp", "8", "--dp-size", "2", "--enable-hicache", "--hicache-size", "40")
    assert (one.local_ranks, two.local_ranks) == (8, 16)
    pool = fit.host_pool_bytes_per_rank(one, MLA_CELL, None)
    assert fit.fits_host(pool, one.local_ranks, seed_budget())
    assert not fit.fits_host(pool, two.local_ranks, seed_budget())


def test_attention_dp_adds_no_ranks():
    assert plan("--tp", "8", "--dp", "8", "--enable-dp-attention").local_ranks == 8


def test_required_memory_is_the_larger_of_the_load_phase_and_the_pools():
    budget = fit.HostBudget(
        usable_bytes=1000,
        reserve_bytes=0,
        per_rank_overhead_bytes=10,
        main_overhead_bytes=5,
        load_transient_bytes=300,
        cpu_offload_bytes_per_rank=1,
    )
    assert fit.required_host_bytes(20, 4, budget) == 4 * 11 + 5 + 300
    assert fit.required_host_bytes(100, 4, budget) == 4 * 11 + 5 + 400


def test_a_lopsided_numa_node_fails_although_the_host_fits():
    pool = 48 * GB
    balanced = [fit.NumaLoad(node=0, available_bytes=250 * GB, ranks=4)] * 2
    lopsided = [
        fit.NumaLoad(node=0, available_bytes=400 * GB, ranks=4),
        fit.NumaLoad(node=1, available_bytes=45 * GB, ranks=4),
    ]
    assert fit.fits_host(pool, 8, seed_budget(), balanced)
    assert not fit.fits_host(pool, 8, seed_budget(), lopsided)
    assert fit.numa_required_bytes(pool, lopsided[1], seed_budget()) > 45 * GB


def test_the_safe_size_respects_the_tightest_numa_node():
    numa = [
        fit.NumaLoad(node=0, available_bytes=400 * GB, ranks=4),
        fit.NumaLoad(node=1, available_bytes=100 * GB, ranks=4),
    ]
    safe = fit.max_hicache_size_gb(
        bytes_per_token=MLA_CELL,
        indexer_bytes_per_token=0,
        page_size=1,
        local_ranks=8,
        budget=seed_budget(),
        numa=numa,
    )
    # Node 1: 4 × (size + 4 GiB) ≤ 100 GB -> size ≤ 20.7 GB.
    assert safe == 20


def test_nothing_fits_gives_zero():
    safe = fit.max_hicache_size_gb(
        bytes_per_token=MLA_CELL,
        indexer_bytes_per_token=0,
        page_size=1,
        local_ranks=8,
        budget=seed_budget(50 * GB),
    )
    assert safe == 0


# --- device pool ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mib", "mla", "expected"),
    [
        (143_771, False, 0.893),
        (143_771, True, 0.886),
        (81_559, False, 0.812),
        (81_559, True, 0.799),
    ],
)
def test_auto_mem_fraction_matches_sglangs_worked_examples(mib, mla, expected):
    assert fit.auto_mem_fraction_static(mib * MiB, plan("--tp", "8"), mla=mla) == expected


def test_auto_mem_fraction_shrinks_with_dp_attention_graphs():
    dp_attn = plan("--tp", "8", "--attn-dp-size", "8")
    assert fit.auto_mem_fraction_static(143_771 * MiB, dp_attn, mla=True) < 0.8


def test_small_gpus_use_the_small_buckets():
    assert 0.0 < fit.auto_mem_fraction_static(16 * GiB, plan(), mla=False) < 0.9
    assert 0.0 < fit.auto_mem_fraction_static(24 * GiB, plan("--tp", "4"), mla=False) < 0.9
    assert 0.0 < fit.auto_mem_fraction_static(48 * GiB, plan(), mla=False) < 0.95
    assert 0.8 < fit.auto_mem_fraction_static(180 * GiB, plan(), mla=False) < 0.9


@pytest.mark.parametrize("total", [0, -1, 1])
def test_auto_mem_fraction_never_divides_by_zero(total):
    """Validation refuses such GPUs at the edge; core still answers (no room) for any input."""
    assert fit.auto_mem_fraction_static(total, plan("--tp", "8"), mla=False) == 0.0


def test_sizes_with_a_zero_cell_or_page_do_not_divide_by_zero():
    assert fit.size_mode_pool_bytes(10, 0, 0, 1) == 0
    assert fit.page_aligned_tokens(100, 0) == 101
    kwargs: dict[str, Any] = {"gpu_free_bytes": GB, "weights_per_rank_bytes": 0}
    kwargs |= {"mem_fraction_static": 0.9, "bytes_per_token": 1000, "max_total_tokens": None}
    assert fit.estimate_device_tokens(page_size=0, **kwargs) == 900_000


def test_device_tokens_are_page_floored_and_capped():
    kwargs: dict[str, Any] = {
        "gpu_free_bytes": 100 * GB,
        "weights_per_rank_bytes": 50 * GB,
        "mem_fraction_static": 0.9,
        "bytes_per_token": 1000,
        "page_size": 64,
        "max_total_tokens": None,
    }
    tokens = fit.estimate_device_tokens(**kwargs)
    assert tokens == (40 * GB // 1000) // 64 * 64
    assert fit.estimate_device_tokens(**{**kwargs, "max_total_tokens": 4096}) == 4096
    assert fit.estimate_device_tokens(**{**kwargs, "weights_per_rank_bytes": 95 * GB}) == 0


@pytest.mark.parametrize("requested", [2.0, 1.2])
def test_auto_sizing_only_lowers_the_mode_s_default_ratio_and_can_go_negative(requested):
    kwargs: dict[str, Any] = {
        "ranks_per_host": 8,
        "host_memory_fraction": 0.8,
        "device_tokens": 10_000_000,
        "bytes_per_token": 1000,
        "requested_ratio": requested,
    }
    assert fit.estimate_auto_ratio(usable_bytes=2000 * GB, **kwargs) == requested
    small = fit.estimate_auto_ratio(usable_bytes=50 * GB, **kwargs)
    assert 0 < small < 1.2
    assert fit.estimate_auto_ratio(usable_bytes=5 * GB, **kwargs) < 0


# --- properties ----------------------------------------------------------------------------

cells = st.integers(min_value=1_000, max_value=400_000)
ranks = st.integers(min_value=1, max_value=16)
memory = st.integers(min_value=0, max_value=4_000 * GB)


@given(cell=cells, local_ranks=ranks, usable=memory, extra=memory, size=st.integers(1, 500))
def test_more_ram_never_turns_fit_into_no_fit(cell, local_ranks, usable, extra, size):
    pool = fit.size_mode_pool_bytes(size, cell, 0, 1)
    if fit.fits_host(pool, local_ranks, seed_budget(usable)):
        assert fit.fits_host(pool, local_ranks, seed_budget(usable + extra))


@given(cell=cells, indexer=st.integers(0, 20_000), local_ranks=ranks, usable=memory)
def test_the_suggested_size_always_fits_and_one_more_does_not(cell, indexer, local_ranks, usable):
    budget = seed_budget(usable)
    safe = fit.max_hicache_size_gb(
        bytes_per_token=cell,
        indexer_bytes_per_token=indexer,
        page_size=1,
        local_ranks=local_ranks,
        budget=budget,
    )
    next_pool = fit.size_mode_pool_bytes(safe + 1, cell, indexer, 1)
    assert not fit.fits_host(next_pool, local_ranks, budget)
    if safe:
        pool = fit.size_mode_pool_bytes(safe, cell, indexer, 1)
        assert fit.fits_host(pool, local_ranks, budget)


# --- checks and the report -----------------------------------------------------------------


def test_host_check_decisions():
    assert check_memlock(None).status is Status.OK
    assert check_memlock(8 * MiB).status is Status.WARN
    assert check_memlock(0, readable=False).status is Status.WARN
    lifted = check_memlock(8 * MiB, ipc_lock=True)
    assert lifted.status is Status.OK
    assert "CAP_IPC_LOCK" in lifted.detail
    need = ShmNeed(sglang_bytes=24 * MiB, nccl_bytes=8 * MiB, parts=())
    assert check_shm(ShmSpace(size_bytes=64 * MiB, free_bytes=64 * MiB), need).status is (
        Status.WARN  # Docker's default, under the 1 GiB NCCL asks of a container
    )
    assert check_shm(None, need).status is Status.WARN
    assert check_shm(ShmSpace(size_bytes=32 * GiB, free_bytes=32 * GiB), need).status is (Status.OK)
    assert check_hugepages(None, None, None) is None
    assert check_hugepages("1GB", None, 10).status is Status.FAIL  # type: ignore[union-attr]
    assert check_hugepages("1GB", 5, 10).status is Status.FAIL  # type: ignore[union-attr]
    assert check_hugepages("1GB", 50, 10).status is Status.OK  # type: ignore[union-attr]
    held = check_gpu_holders({41: [0, 1]})
    assert held.status is Status.FAIL
    assert "pid 41" in held.detail
    assert check_gpu_holders({}).status is Status.OK


def test_report_verdict_is_no_fit_when_any_check_fails():
    report = FitReport(
        model="m",
        attention="mla",
        kv_cache_dtype="bf16",
        layers_per_rank=61,
        local_ranks=8,
        bytes_per_token_per_rank=MLA_CELL,
        indexer_bytes_per_token_per_rank=0,
        weights_per_rank_bytes=None,
        gpu_memory_bytes=None,
        gpu_free_bytes=None,
        mem_fraction_static=None,
        device_tokens_per_rank=None,
        hicache_mode="size",
        hicache_ratio=None,
        host_pool_tokens_per_rank=10,
        host_pool_bytes_per_rank=10 * MLA_CELL,
        host_required_bytes=1,
        host_budget_bytes=2,
        terms=(),
        max_hicache_size_gb=0,
        equivalent_ratio=None,
        safe_host_tokens_per_rank=0,
        avg_request_tokens=4096,
        sglang_version=None,
        checks=(Check("a", Status.WARN, "w"), Check("b", Status.FAIL, "f")),
    )
    data = report.to_json()
    assert data["verdict"] == "no-fit"
    assert data["device_tokens_per_rank"] is None
    assert data["checks"][1] == {"name": "b", "status": "fail", "detail": "f"}
    table = report.render_table()
    assert "NO FIT" in table
    assert "not even 1 GB" in table
