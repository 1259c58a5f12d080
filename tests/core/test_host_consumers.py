"""SGLang's opt-in features that hold host memory: each counted where SGLang gives a size,
each warned about (flag, multiplier, bound) where it does not; and the budget that counts them."""

from __future__ import annotations

import dataclasses

import pytest

from supervisor.core import fit, offload
from supervisor.core.checks import Check, Status
from supervisor.core.host_consumers import (
    Consumer,
    ConsumerFacts,
    Found,
    cpu_offload,
    feature_consumers,
)
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GB, GiB, MiB
from tests.core.test_offload import llama_tensors, moe_tensors

FACTS = ConsumerFacts(
    env={},
    weights_per_rank_bytes=17 * GB,
    device_tokens=1_000_000,
    bytes_per_token=40_960,
    main_overhead_bytes=6 * GiB,
    stage_layer_count=80,
)


def plan(*args: str):
    return parse_launch_args(["--model-path", "m", "--tp", "8", *args])


def check(found: Found, name: str) -> Check:
    (only,) = [c for c in found.checks if c.name == name]
    return only


def counted(found: Found, name: str) -> Consumer:
    (only,) = [c for c in found.counted if c.name == name]
    return only


# --- --enable-weights-cpu-backup -----------------------------------------------------------


def test_the_weights_backup_is_a_copy_of_each_ranks_weights_per_rank():
    found = feature_consumers(plan("--enable-memory-saver", "--enable-weights-cpu-backup"), FACTS)
    backup = counted(found, "weights_backup")
    assert (backup.each_bytes, backup.holders, backup.bytes) == (17 * GB, 8, 136 * GB)
    assert backup.per_rank
    assert "load_model_utils.py:307-326" in backup.detail


def test_without_the_memory_saver_the_backup_takes_nothing():
    found = feature_consumers(plan("--enable-weights-cpu-backup"), FACTS)
    assert found.counted == []
    assert check(found, "weights_backup").status is Status.OK
    assert "--enable-memory-saver" in check(found, "weights_backup").detail


def test_a_backup_with_unknown_weights_warns_with_the_multiplier_and_the_bound():
    facts = dataclasses.replace(FACTS, weights_per_rank_bytes=None)
    found = feature_consumers(plan("--enable-memory-saver", "--enable-weights-cpu-backup"), facts)
    detail = check(found, "weights_backup").detail
    assert check(found, "weights_backup").status is Status.WARN
    assert "--enable-weights-cpu-backup" in detail
    assert "× 8 local ranks" in detail
    assert "drop the flag to bound it" in detail


def test_a_draft_models_backup_is_warned_about():
    args = ("--enable-memory-saver", "--enable-draft-weights-cpu-backup")
    found = feature_consumers(plan(*args, "--speculative-algorithm", "EAGLE"), FACTS)
    assert found.counted == []
    detail = check(found, "weights_backup").detail
    assert "--enable-draft-weights-cpu-backup" in detail
    assert "× 8 local ranks" in detail


# --- KTransformers, LoRA, LMCache, FlexKV: warned about -------------------------------------


def test_kt_cpu_experts_are_warned_about_with_the_expert_count():
    facts = dataclasses.replace(FACTS, routed_experts=384)
    found = feature_consumers(plan("--kt-weight-path", "/w", "--kt-num-gpu-experts", "64"), facts)
    detail = check(found, "kt_experts").detail
    assert "--kt-weight-path: 320 of 384 experts" in detail
    assert "once per TP group by its rank 0" in detail
    assert "--kt-num-gpu-experts" in detail
    assert found.counted == []


def test_lora_adapters_are_warned_about_per_rank_with_the_cap_to_set():
    found = feature_consumers(plan("--lora-paths", "a=/x", "b=/y", "c=/z"), FACTS)
    detail = check(found, "lora").detail
    assert check(found, "lora").status is Status.WARN
    assert "--lora-paths (3 adapters): each of the 8 local ranks" in detail
    assert "with no cap (--max-loaded-loras unset)" in detail
    assert "Bound it with --max-loaded-loras" in detail


def test_lora_overlap_loading_holds_a_second_pinned_copy():
    args = ("--enable-lora", "--max-loaded-loras", "16", "--enable-lora-overlap-loading")
    detail = check(feature_consumers(plan(*args), FACTS), "lora").detail
    assert "up to --max-loaded-loras 16 in all" in detail
    assert "a second time, pinned" in detail


def test_lmcache_and_flexkv_are_sized_by_their_own_files():
    found = feature_consumers(plan("--enable-lmcache", "--enable-flexkv"), FACTS)
    assert check(found, "lmcache").status is Status.WARN
    assert "--enable-lmcache" in check(found, "lmcache").detail
    flexkv = check(found, "flexkv").detail
    assert "--enable-flexkv" in flexkv
    assert "cpu_cache_gb" in flexkv
    assert "per data-parallel" in flexkv
    env = dataclasses.replace(FACTS, env={"FLEXKV_CONFIG_PATH": "/etc/flexkv.yaml"})
    assert (
        "/etc/flexkv.yaml"
        in check(feature_consumers(plan("--enable-flexkv"), env), "flexkv").detail
    )


def test_no_opt_in_flag_no_consumer():
    found = feature_consumers(plan(), FACTS)
    assert (found.counted, found.checks) == ([], [])


# --- tokenizer workers ---------------------------------------------------------------------


def test_tokenizer_workers_each_take_a_main_process_share_on_the_first_node():
    found = feature_consumers(plan("--tokenizer-worker-num", "4"), FACTS)
    workers = counted(found, "tokenizers")
    assert (workers.each_bytes, workers.holders, workers.bytes) == (6 * GiB, 4, 24 * GiB)
    assert not workers.per_rank
    two_nodes = ("--tokenizer-worker-num", "4", "--nnodes", "2", "--node-rank", "1")
    assert feature_consumers(plan(*two_nodes), FACTS).counted == []


# --- layer offload -------------------------------------------------------------------------


def moe_facts() -> ConsumerFacts:
    layers = offload.rank_layer_blocks(moe_tensors(), tp_size=1, pp_size=1, num_layers=4)
    return dataclasses.replace(FACTS, layers=layers, stage_layer_count=4)


def layer_offload_plan(mode: str, *more: str):
    args = ["--model-path", "m", "--offload-group-size", "2", "--offload-mode", mode, *more]
    return parse_launch_args(args)


def test_layer_offload_in_cpu_mode_pins_the_experts_on_every_rank():
    found = feature_consumers(layer_offload_plan("cpu", "--dp", "2"), moe_facts())
    moved = counted(found, "layer_offload")
    assert (moved.each_bytes, moved.holders, moved.per_rank) == (2 * 12 * MiB, 2, True)
    assert "--offload-num-in-group" in moved.detail
    assert "per rank" in moved.detail


def test_layer_offload_in_shm_cpu_mode_keeps_one_exact_copy_per_node():
    found = feature_consumers(layer_offload_plan("shm_cpu", "--dp", "2"), moe_facts())
    moved = counted(found, "layer_offload")
    assert (moved.each_bytes, moved.holders, moved.holder) == (18_000_000, 1, "node")


def test_layer_offload_meta_takes_nothing_and_tp_above_1_is_refused_for_shared_modes():
    found = feature_consumers(layer_offload_plan("meta"), moe_facts())
    assert found.counted == []
    assert check(found, "layer_offload").status is Status.OK
    refused = feature_consumers(layer_offload_plan("shm_cpu", "--tp", "2"), moe_facts())
    assert check(refused, "layer_offload").status is Status.FAIL


def test_layer_offload_without_the_tensor_list_counts_whole_layers_twice_and_warns():
    facts = dataclasses.replace(FACTS, stage_layer_count=4, weights_per_rank_bytes=40 * GB)
    found = feature_consumers(layer_offload_plan("cpu"), facts)
    moved = counted(found, "layer_offload")
    assert moved.each_bytes == 2 * 40 * GB * 2 // 4  # 2 of 4 layers, twice for the blocks
    assert check(found, "layer_offload").status is Status.WARN


def test_cpu_offload_gb_switches_layer_offload_off():
    found = feature_consumers(layer_offload_plan("cpu", "--cpu-offload-gb", "1"), moe_facts())
    assert found.counted == []


def test_layer_offload_of_a_model_without_experts_warns():
    layers = offload.rank_layer_blocks(llama_tensors(4), tp_size=1, pp_size=1, num_layers=4)
    facts = dataclasses.replace(FACTS, layers=layers, stage_layer_count=4)
    found = feature_consumers(layer_offload_plan("cpu"), facts)
    assert counted(found, "layer_offload").bytes == 0
    assert any("only FusedMoE experts" in c.detail for c in found.checks)


# --- --cpu-offload-gb ----------------------------------------------------------------------


def test_cpu_offload_gb_is_gib_and_counts_the_power_of_two_blocks():
    layers = offload.rank_layer_blocks(llama_tensors(), tp_size=8, pp_size=1, num_layers=80)
    facts = dataclasses.replace(FACTS, layers=layers)
    pinned, note = cpu_offload(plan("--cpu-offload-gb", "1"), facts)
    assert pinned == 1_292_009_472  # tests/core/test_offload.py, worked by hand
    assert note is not None
    assert note.status is Status.OK
    assert "1 GiB (1.1 GB)" in note.detail


def test_cpu_offload_gb_without_the_tensor_list_counts_the_worst_case_and_warns():
    pinned, note = cpu_offload(plan("--cpu-offload-gb", "5"), FACTS)
    assert pinned == 10 * GiB
    assert note is not None
    assert note.status is Status.WARN
    assert cpu_offload(plan(), FACTS) == (0, None)


# --- the budget ----------------------------------------------------------------------------


def consumer(each: int, holders: int, per_rank: bool) -> Consumer:
    return Consumer(
        name="x", flag="--x", each_bytes=each, holders=holders, holder="rank", per_rank=per_rank,
        detail="",
    )  # fmt: skip


def test_the_budget_counts_every_consumer_and_numa_only_the_per_rank_ones():
    base = fit.HostBudget(
        usable_bytes=1000 * GB, reserve_bytes=0, per_rank_overhead_bytes=0, main_overhead_bytes=0
    )
    budget = dataclasses.replace(
        base, consumers=(consumer(3 * GB, 8, per_rank=True), consumer(5 * GB, 1, per_rank=False))
    )
    assert fit.required_host_bytes(GB, 8, budget) - fit.required_host_bytes(GB, 8, base) == 29 * GB
    node = fit.NumaLoad(node=0, available_bytes=0, ranks=4)
    assert fit.numa_required_bytes(GB, node, budget) == 4 * (GB + 3 * GB)


@pytest.mark.parametrize("each", [100 * GB, 101 * GB])
def test_a_consumer_can_turn_a_fit_into_a_no_fit(each):
    budget = fit.HostBudget(
        usable_bytes=1000 * GB,
        reserve_bytes=0,
        per_rank_overhead_bytes=0,
        main_overhead_bytes=0,
        consumers=(consumer(each, 2, per_rank=True),),
    )
    assert fit.fits_host(400 * GB, 2, budget) is (each == 100 * GB)
