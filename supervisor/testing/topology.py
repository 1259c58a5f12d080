"""Which processes SGLang 0.5.23 starts on a node, who their parent is, and their titles.

Written from (paths under sglang/srt/):
- entrypoints/engine.py `Engine._launch_scheduler_processes`: a DP controller exists when
  `num_dp_ranks > 1`; with attention DP the main process pre-launches the schedulers itself
  (`prelaunch_dp_schedulers`) and inserts the controller first in its list, otherwise the
  controller spawns them; `_calculate_rank_ranges` and the GPU formula; worker nodes
  (node_rank >= 1) return before `_launch_detokenizer_subprocesses`, so they run no detokenizer.
- managers/data_parallel_controller.py `launch_dp_schedulers` (one TP group per DP rank, GPUs
  offset by tp × pp × gpu_id_step), `launch_tensor_parallel_group` (the DP rank of an attention-DP
  scheduler comes from `compute_dp_attention_world_info`).
- runtime_context.py `num_dp_ranks_of` (dp_size × attn_dp_size), `derive_spawn_ranks`,
  `derive_attention_ranks`; arg_groups/parallel_hook.py `handle_deprecated_dp_attention`.
- managers/scheduler.py `configure_scheduler_process`: the title parts DP, PP, ATTN_CP, MOE_DP,
  TP, EP, in that order, each only when its width is > 1 (DP: when the launcher gave a DP rank).
- entrypoints/engine.py `_launch_detokenizer_subprocesses` and serving_hook.py
  (`--skip-tokenizer-init` forces one detokenizer).
- distributed/parallel_state.py `initialize_model_parallel`: the groups built with
  use_message_queue_broadcaster (SGLANG_USE_MESSAGE_QUEUE_BROADCASTER, default on): TP, and
  attention TP / attention CP when they are narrower than TP (DCP and PD-multiplexing groups are
  not simulated). `GroupCoordinator.__init__` makes a broadcaster for each group wider than 1;
  its writer is the group's first rank (shm_broadcast.py `create_from_process_group`), which
  creates a ring buffer in /dev/shm only when some reader is on its node (`MessageQueue`).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.testing.args import SimArgs


@dataclass(frozen=True, slots=True, kw_only=True)
class Widths:
    """The parallel widths after SGLang's resolution."""

    tp: int
    pp: int
    dp: int  # whole-model replicas
    attn_dp: int
    attn_cp: int
    moe_dp: int
    ep: int

    @property
    def num_dp_ranks(self) -> int:
        return self.dp * self.attn_dp

    @property
    def attn_tp(self) -> int:
        return max(1, self.tp // self.attn_dp // self.attn_cp)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPlace:
    """One scheduler on this node."""

    title: str
    log_prefix: str  # " DP0 TP1" as SGLang's logger prefix, "" for a lone rank
    gpu: int
    # One entry per group whose broadcaster this rank writes: its readers on this node.
    broadcasts: tuple[int, ...] = ()
    # The first rank of its attention group at PP stage 0 writes the load snapshot, in its DP
    # rank's slot (managers/scheduler.py `init_ipc_channels`); None: it does not.
    loads_slot: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessPlan:
    """The children SGLang starts on this node, in its order."""

    dp_controller: bool  # sglang::data_parallel_controller, a child of the main process
    controller_spawns_ranks: bool  # plain DP: the schedulers are the controller's children
    ranks: tuple[RankPlace, ...]
    dp_groups: tuple[tuple[int, int], ...]  # plain DP: (dp_rank, first GPU offset) per group
    detokenizers: int  # all titled sglang::detokenizer; 0 on worker nodes
    detokenizer_router: bool  # sglang::detokenizer_router, with more than one detokenizer
    tokenizer_workers: int  # sglang::tokenizer_worker:{pid}, with --tokenizer-worker-num > 1


def widths(args: SimArgs) -> Widths:
    dp, attn_dp = args.dp_size, args.attn_dp_size
    if args.enable_dp_attention and attn_dp == 1:
        dp, attn_dp = 1, dp  # the deprecated spelling counted attention-DP groups in dp_size
    return Widths(
        tp=args.tp_size,
        pp=args.pp_size,
        dp=dp,
        attn_dp=attn_dp,
        attn_cp=args.attn_cp_size,
        moe_dp=args.moe_dp_size,
        ep=args.ep_size,
    )


def scheduler_title(w: Widths, *, dp_rank: int | None, pp_rank: int, tp_rank: int) -> str:
    """sglang::scheduler plus one _PART per width > 1, ranks derived as SGLang derives them."""
    parts: list[str] = []
    if dp_rank is not None:
        parts.append(f"DP{dp_rank}")
    if w.pp > 1:
        parts.append(f"PP{pp_rank}")
    attn_cp_rank = (tp_rank // w.attn_tp) % w.attn_cp
    if w.attn_cp > 1:
        parts.append(f"ATTN_CP{attn_cp_rank}")
    moe_group = max(1, w.tp // w.moe_dp)  # TP ranks per MoE-DP group
    if w.moe_dp > 1:
        # MoE-DP aliases the attention-CP group when CP is wider (runtime_context.py publish).
        parts.append(f"MOE_DP{attn_cp_rank if w.moe_dp < w.attn_cp else tp_rank // moe_group}")
    if w.tp > 1:
        parts.append(f"TP{tp_rank}")
    if w.ep > 1:
        parts.append(f"EP{tp_rank % moe_group // max(1, moe_group // w.ep)}")
    return "sglang::scheduler" + "".join(f"_{p}" for p in parts)


def broadcasts(w: Widths, tp_rank: int, node_tp: range) -> tuple[int, ...]:
    """For each broadcaster group `tp_rank` writes, how many of its readers are on this node
    (`node_tp`: the TP ranks of this node's share of the group). Members are TP ranks."""
    groups: list[range] = []
    if w.tp > 1:
        groups.append(range(w.tp))  # _TP: every TP rank of the PP stage
    if 1 < w.attn_tp != w.tp and tp_rank % w.attn_tp == 0:
        groups.append(range(tp_rank, tp_rank + w.attn_tp))  # _ATTN_TP: consecutive ranks
    span = w.attn_tp * w.attn_cp
    if 1 < w.attn_cp != w.tp and tp_rank % span < w.attn_tp:
        groups.append(range(tp_rank, tp_rank + span, w.attn_tp))  # _ATTN_CP: strided ranks
    return tuple(
        sum(1 for member in group[1:] if member in node_tp)
        for group in groups
        if group[0] == tp_rank
    )


def _place(args: SimArgs, w: Widths, gpu_base: int, dp_rank: int | None) -> list[RankPlace]:
    """One TP × PP group on this node (`_calculate_rank_ranges`, the GPU formula)."""
    pp_per_node = max(w.pp // args.nnodes, 1)
    nnodes_per_pp_rank = max(args.nnodes // w.pp, 1)
    tp_per_node = w.tp // nnodes_per_pp_rank
    pp_first = pp_per_node * (args.node_rank // nnodes_per_pp_rank)
    tp_first = tp_per_node * (args.node_rank % nnodes_per_pp_rank)
    out: list[RankPlace] = []
    for pp_rank in range(pp_first, pp_first + pp_per_node):
        for tp_rank in range(tp_first, tp_first + tp_per_node):
            shown_dp = dp_rank
            if w.attn_dp > 1:
                shown_dp = tp_rank // (w.attn_tp * w.attn_cp)  # the attention-DP rank
            title = scheduler_title(w, dp_rank=shown_dp, pp_rank=pp_rank, tp_rank=tp_rank)
            gpu = (
                args.base_gpu_id
                + gpu_base
                + (pp_rank % pp_per_node) * tp_per_node
                + (tp_rank % tp_per_node) * args.gpu_id_step
            )
            prefix = title.removeprefix("sglang::scheduler").replace("_", " ")
            node_tp = range(tp_first, tp_first + tp_per_node)
            out.append(
                RankPlace(
                    title=title,
                    log_prefix=prefix,
                    gpu=gpu,
                    broadcasts=broadcasts(w, tp_rank, node_tp),
                    loads_slot=(shown_dp or 0)
                    if pp_rank == 0 and tp_rank % (w.attn_tp * w.attn_cp) == 0
                    else None,
                )
            )
    return out


def process_plan(args: SimArgs) -> ProcessPlan:
    w = widths(args)
    controller = w.num_dp_ranks > 1
    spawned_by_controller = controller and w.attn_dp == 1
    ranks: list[RankPlace] = []
    groups: list[tuple[int, int]] = []
    if spawned_by_controller:
        for dp_rank in range(w.num_dp_ranks):
            base = dp_rank * w.tp * w.pp * args.gpu_id_step
            groups.append((dp_rank, base))
            ranks += _place(args, w, base, dp_rank)
    else:
        ranks = _place(args, w, 0, None)
    head = args.node_rank == 0
    detokenizers = 1 if args.skip_tokenizer_init else max(1, args.detokenizer_worker_num)
    return ProcessPlan(
        dp_controller=controller,
        controller_spawns_ranks=spawned_by_controller,
        ranks=tuple(ranks),
        dp_groups=tuple(groups),
        detokenizers=detokenizers if head else 0,
        detokenizer_router=head and detokenizers > 1,
        tokenizer_workers=args.tokenizer_worker_num
        if head and args.tokenizer_worker_num > 1
        else 0,
    )
