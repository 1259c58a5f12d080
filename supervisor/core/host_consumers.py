"""Host memory that SGLang's opt-in features take beside the KV pools (docs/sglang.md §1.10).

Each feature is counted in the host plan where SGLang's own code gives its size, and warned
about where it does not; a warning names the flag, how many copies the node holds, and what
bounds it. Read from SGLang 0.5.23. The storage tiers of HiCache are core/storage_consumers.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.core import offload
from supervisor.core.checks import Check, Status
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GiB, format_gb


class ConsumerError(ValueError):
    """A value SGLang would refuse or silently ignore (the message names it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Consumer:
    """One counted consumer: what one holder allocates, and how many holders the node has."""

    name: str
    flag: str  # what turns it on
    each_bytes: int
    holders: int
    holder: str  # "rank", "node", "tokenizer worker"
    per_rank: bool  # one per local scheduler: it also weighs on that rank's NUMA node
    detail: str

    @property
    def bytes(self) -> int:
        return self.each_bytes * self.holders

    @property
    def label(self) -> str:
        return f"{self.flag} {format_gb(self.each_bytes)} × {self.holders}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "flag": self.flag,
            "bytes": self.bytes,
            "each_bytes": self.each_bytes,
            "holders": self.holders,
            "holder": self.holder,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class StorageDir:
    """The file storage backend's directory as the pre-flight read it (None: unreadable)."""

    path: str
    fs_type: str | None
    free_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerFacts:
    """What the consumers are sized from."""

    env: Mapping[str, str]  # the environment the server will get
    weights_per_rank_bytes: int | None
    device_tokens: int | None
    bytes_per_token: int
    indexer_bytes_per_token: int = 0
    rank_replicated_kv: bool = False  # MLA/DSA: every rank holds the whole row
    main_overhead_bytes: int = 0
    layers: tuple[tuple[offload.Block, ...], ...] | None = None  # the rank's parameters
    stage_layer_count: int = 0
    routed_experts: int | None = None
    storage_dir: StorageDir | None = None  # None: not read (planning another box)
    # A hybrid model's pools (core/hybrid_geometry.py): `bytes_per_token` is then the full (or
    # attention) pool's row, and a storage tier may map a page of each other pool too.
    layout: HybridLayout | None = None


@dataclass(frozen=True, slots=True)
class Found:
    """Counted consumers and the checks (notes, warnings, refusals) about them."""

    counted: list[Consumer] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    def warn(self, name: str, detail: str) -> None:
        self.checks.append(Check(name, Status.WARN, detail))

    def count(self, consumer: Consumer, status: Status = Status.OK) -> None:
        self.counted.append(consumer)
        self.checks.append(Check(consumer.name, status, f"counted: {consumer.detail}"))


def feature_consumers(plan: LaunchPlan, facts: ConsumerFacts) -> Found:
    """The opt-in features of the argv that hold host memory, counted or warned about."""
    found = Found()
    _weights_backup(plan, facts, found)
    _kt_experts(plan, facts, found)
    _layer_offload(plan, facts, found)
    _lora(plan, found)
    _tokenizer_workers(plan, facts, found)
    _external_tiers(plan, facts, found)
    return found


def _weights_backup(plan: LaunchPlan, facts: ConsumerFacts, found: Found) -> None:
    """A host copy of each rank's weights, made when they are released (RL weight updates)."""
    if not (plan.enable_weights_cpu_backup or plan.enable_draft_weights_cpu_backup):
        return
    if not plan.enable_memory_saver:
        # The memory saver's no-op adapter ignores enable_cpu_backup
        # (utils/torch_memory_saver_adapter.py:51, 145; model_executor/model_runner.py:744-747).
        detail = "no host copy: the weights CPU backup works only with --enable-memory-saver"
        found.checks.append(Check("weights_backup", Status.OK, detail))
        return
    ranks = plan.local_ranks
    if plan.enable_weights_cpu_backup:
        weights = facts.weights_per_rank_bytes
        if weights is None:
            found.warn(
                "weights_backup",
                f"--enable-weights-cpu-backup copies each rank's weights to host memory on "
                f"release, × {ranks} local ranks, and the weights are unknown: set "
                "[preflight] weights, or drop the flag to bound it",
            )
        else:
            detail = (
                f"--enable-weights-cpu-backup: each of {ranks} ranks copies its "
                f"{format_gb(weights)} of weights to host memory when they are released "
                "(model_executor/model_runner_components/load_model_utils.py:307-326)"
            )
            found.count(
                _per_rank("weights_backup", "--enable-weights-cpu-backup", weights, plan, detail)
            )
    if plan.speculative_algorithm is not None:
        found.warn(
            "weights_backup",
            "the draft model's weights are backed up too (--enable-weights-cpu-backup or "
            f"--enable-draft-weights-cpu-backup), × {ranks} local ranks, and not counted: "
            "their size is the draft checkpoint's; drop the flag to bound it",
        )


def _per_rank(name: str, flag: str, each: int, plan: LaunchPlan, detail: str) -> Consumer:
    return Consumer(
        name=name,
        flag=flag,
        each_bytes=each,
        holders=plan.local_ranks,
        holder="rank",
        per_rank=True,
        detail=detail,
    )


def _kt_experts(plan: LaunchPlan, facts: ConsumerFacts, found: Found) -> None:
    """KTransformers: TP rank 0 of each TP group holds the CPU experts of its layers."""
    if plan.kt_weight_path is None:
        return
    gpu = plan.kt_num_gpu_experts
    share = "the experts not on the GPU"
    if facts.routed_experts is not None and gpu is not None:
        share = f"{max(0, facts.routed_experts - gpu)} of {facts.routed_experts} experts"
    found.warn(
        "kt_experts",
        f"--kt-weight-path: {share} of every MoE layer live in host memory, loaded once per "
        "TP group by its rank 0 (layers/moe/kt_ep_wrapper.py:218-258), and SGLang gives no "
        "size (the CPU expert files set it): not counted. Bound it with a larger "
        "--kt-num-gpu-experts or a smaller --kt-method",
    )


def _layer_offload(plan: LaunchPlan, facts: ConsumerFacts, found: Found) -> None:
    """`--offload-group-size`: the MoE experts of N layers in every G in host memory."""
    group, num = plan.offload_group_size, plan.offload_num_in_group
    if group <= 0 or plan.cpu_offload_gb > 0:  # --cpu-offload-gb wins (utils/offloader.py:69-73)
        return
    mode = plan.offload_mode
    if mode == "meta":
        found.checks.append(Check("layer_offload", Status.OK, "--offload-mode meta: no host copy"))
        return
    if mode != "cpu" and plan.tp_size != 1:
        detail = (
            f"SGLang refuses --offload-mode {mode} with --tp-size {plan.tp_size} "
            "(utils/offloader.py:217)"
        )
        found.checks.append(Check("layer_offload", Status.FAIL, detail))
        return
    flag = f"--offload-group-size {group} --offload-num-in-group {num}"
    sized = _offload_size(plan, facts)
    if sized is None:
        found.warn(
            "layer_offload", f"{flag}: cannot size (weights unknown): set [preflight] weights"
        )
        return
    each, how, status = sized
    # cpu: every rank pins its own copy; shm_cpu: one copy per node in /dev/shm; sharded_gpu:
    # rank 0 keeps its pinned staging copy (utils/offloader.py:421-456, 535-547).
    per_rank = mode == "cpu"
    holders = plan.local_ranks if per_rank else int(mode == "shm_cpu" or plan.node_rank == 0)
    moved = offload.offloaded_layers(facts.stage_layer_count, group, num)
    detail = (
        f"{flag} --offload-mode {mode}: the MoE experts of {moved} of "
        f"{facts.stage_layer_count} layers in host memory ({how}), "
        f"{'per rank' if per_rank else 'once per node'}; bound it with a smaller "
        "--offload-num-in-group"
    )
    consumer = Consumer(
        name="layer_offload",
        flag=flag,
        each_bytes=each,
        holders=holders,
        holder="rank" if per_rank else "node",
        per_rank=per_rank,
        detail=detail,
    )
    found.count(consumer, status)
    if each == 0:
        found.warn(
            "layer_offload",
            f"{flag}: no MoE expert weights in the checkpoint's layers; SGLang's layer offload "
            "moves only FusedMoE experts (models/deepseek_v2.py:2973-2995)",
        )


def _offload_size(plan: LaunchPlan, facts: ConsumerFacts) -> tuple[int, str, Status] | None:
    """Host bytes one holder of the layer offload takes, how they were found, how sure."""
    group, num = plan.offload_group_size, plan.offload_num_in_group
    pinned = plan.offload_mode != "shm_cpu"  # shared memory is allocated at its exact size
    if facts.layers is not None:
        each = offload.layer_offload_bytes(facts.layers, group, num, pinned=pinned)
        how = "the checkpoint's experts" + (" in power-of-two pinned blocks" if pinned else "")
        return each, how, Status.OK
    layers = facts.stage_layer_count
    if facts.weights_per_rank_bytes is None or not layers:
        return None
    moved = offload.offloaded_layers(layers, group, num)
    each = facts.weights_per_rank_bytes * moved // layers * (2 if pinned else 1)
    how = "at most: whole layers" + (", twice for power-of-two pinned blocks" if pinned else "")
    return each, how, Status.WARN


def _lora(plan: LaunchPlan, found: Found) -> None:
    """LoRA adapters: every rank holds each loaded adapter whole in host memory."""
    if not (plan.lora_paths or plan.enable_lora):
        return
    given = len(plan.lora_paths)
    cap = plan.max_loaded_loras
    more = (
        f"up to --max-loaded-loras {cap} in all"
        if cap is not None
        else "with no cap (--max-loaded-loras unset)"
    )
    pinned = (
        "; with --enable-lora-overlap-loading each is held a second time, pinned "
        "(lora/mem_pool.py:751-777)"
        if plan.enable_lora_overlap_loading
        else ""
    )
    found.warn(
        "lora",
        f"--lora-paths ({given} adapter{'s' if given != 1 else ''}): each of the "
        f"{plan.local_ranks} local ranks loads every adapter whole into host memory "
        "(lora/lora.py:178-196, lora/lora_manager.py:919-930), and adapters loaded later "
        f"through /load_lora_adapter add to them {more}{pinned}; SGLang gives no size (the "
        "adapter files set it): not counted. Bound it with --max-loaded-loras",
    )


def _tokenizer_workers(plan: LaunchPlan, facts: ConsumerFacts, found: Found) -> None:
    """`--tokenizer-worker-num N > 1`: N HTTP workers, each with its own TokenizerManager."""
    workers = plan.tokenizer_worker_num
    if workers <= 1 or plan.node_rank != 0:  # the HTTP server runs on the first node only
        return
    detail = (
        f"--tokenizer-worker-num {workers}: each worker process runs its own HTTP server and "
        "TokenizerManager beside the main process's (entrypoints/http_server.py:242-275, "
        "302-310; managers/multi_tokenizer_mixin.py:839), counted as [preflight] main_overhead "
        "each; bound it with fewer workers"
    )
    consumer = Consumer(
        name="tokenizers",
        flag=f"--tokenizer-worker-num {workers}",
        each_bytes=facts.main_overhead_bytes,
        holders=workers,
        holder="tokenizer worker",
        per_rank=False,
        detail=detail,
    )
    found.count(consumer)


def _external_tiers(plan: LaunchPlan, facts: ConsumerFacts, found: Found) -> None:
    """LMCache and FlexKV size their CPU tiers in their own configuration files."""
    if plan.enable_lmcache:
        found.warn(
            "lmcache",
            "--enable-lmcache: the CPU tier is the LMCache daemon's, sized by its own "
            "configuration (its L1 size; --lmcache-config-file names the daemon, "
            "mem_cache/storage/lmcache/README.md), once per daemon and outside this launch: "
            "not counted. Bound it with the daemon's L1 size and leave room for it",
        )
    if plan.enable_flexkv:
        source = plan.flexkv_config_file or facts.env.get("FLEXKV_CONFIG_PATH") or "none given"
        found.warn(
            "flexkv",
            f"--enable-flexkv: FlexKV's CPU pool is sized by its config file ({source}; its "
            "cpu_cache_gb), one KVManager per data-parallel route "
            "(mem_cache/storage/flexkv/README.md, mem_cache/registry.py:132-144): not counted. "
            "Bound it with cpu_cache_gb",
        )


def cpu_offload(plan: LaunchPlan, facts: ConsumerFacts) -> tuple[int, Check | None]:
    """Pinned host bytes per rank of `--cpu-offload-gb` (GiB), and the check explaining them."""
    if plan.cpu_offload_gb <= 0:
        return 0, None
    limit = plan.cpu_offload_gb * GiB  # utils/offloader.py:68-72
    pinned = offload.cpu_offload_host_bytes(limit, facts.layers, facts.weights_per_rank_bytes)
    head = (
        f"--cpu-offload-gb {plan.cpu_offload_gb} moves {plan.cpu_offload_gb} GiB "
        f"({format_gb(limit)}) of each rank's weights to pinned host memory"
    )
    if facts.layers is None:
        detail = (
            f"{head}; without the checkpoint's tensor list its power-of-two blocks are counted at "
            f"torch's worst case, {format_gb(pinned)} per rank (mem_cache/pool_host/common.py:312)"
        )
        return pinned, Check("cpu_offload", Status.WARN, detail)
    detail = (
        f"{head}, {format_gb(pinned)} per rank once torch rounds each parameter up to a power of "
        "two (utils/offloader.py:153-181, mem_cache/pool_host/common.py:312-313)"
    )
    return pinned, Check("cpu_offload", Status.OK, detail)
