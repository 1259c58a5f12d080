"""Read SGLang's `launch_server` argv into a LaunchPlan, the way SGLang's argparse reads it.

The argv is parsed with the release's own flag table (core/sglang_cli.py): unknown flags,
ambiguous abbreviations, invalid choices and a missing --model-path are refused in SGLang's
words, and a repeated flag counts once, the last one winning. Only the memory and topology flags
become plan fields (core/sglang_flags.py); the user's argv is never reordered, and edits
(`with_flag_value`) and redaction change tokens in place.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.bounded import shown
from supervisor.core.sglang_cli import (
    ArgvError,
    CliRules,
    CliTable,
    merge_yaml,
    option_spans,
    parse_cli,
)
from supervisor.core.sglang_flags import OPTIONS, is_secret_flag
from supervisor.core.sglang_versions import rules_for_version

__all__ = [
    "ArgvError",
    "LaunchPlan",
    "parse_launch_args",
    "redact_argv",
    "secret_flag_names",
    "with_flag_value",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchPlan:
    """The memory and topology view of one launch_server argv, SGLang's defaults applied."""

    argv: tuple[str, ...]
    given: frozenset[str] = field(default_factory=frozenset)  # dests the user set explicitly
    model_path: str | None = None
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    attn_dp_size: int = 1
    enable_dp_attention: bool = False
    ep_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    page_size: int | None = None
    enable_hierarchical_cache: bool = False
    hicache_ratio: float | None = None
    hicache_size_gb: int = 0
    hicache_host_memory_fraction: float = 0.8
    hicache_host_memory_mode: str = "cache"
    hicache_mem_layout: str = "page_first"
    hicache_storage_backend: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    device: str | None = None  # --device; None: SGLang detects it (utils/common.py get_device)
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    weight_loader_disable_mmap: bool = False
    cpu_offload_gb: int = 0
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    api_key: str | None = None
    admin_api_key: str | None = None
    enable_metrics: bool = False
    skip_server_warmup: bool = False
    served_model_name: str | None = None
    config_file: str | None = None
    tokenizer_worker_num: int = 1
    numa_node: tuple[int, ...] | None = None
    chunked_prefill_size: int | None = None
    # Hybrid models' pools (core/pools.py); None: SGLang's fallback (0.8, 0.9, solved, config).
    swa_full_tokens_ratio: float | None = None
    disable_hybrid_swa_memory: bool = False
    mamba_full_memory_ratio: float | None = None
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: str | None = None
    repeated: tuple[str, ...] = ()  # flags given more than once (SGLang takes the last)
    unknown: tuple[str, ...] = ()  # flags the table lacks, passed on (a newer SGLang)
    # The values of every secret flag (sglang_flags.is_secret_flag), the YAML's included.
    secrets: tuple[str, ...] = field(default=(), repr=False)
    # Opt-in host-memory consumers (core/host_consumers.py), with SGLang 0.5.23's defaults
    # (arg_groups/fields/exec_.py, lora.py, memory.py).
    enable_memory_saver: bool = False
    enable_weights_cpu_backup: bool = False
    enable_draft_weights_cpu_backup: bool = False
    kt_weight_path: str | None = None
    kt_num_gpu_experts: int | None = None
    offload_group_size: int = -1
    offload_num_in_group: int = 1
    offload_mode: str = "cpu"
    enable_lora: bool = False
    lora_paths: tuple[str, ...] = ()
    max_loaded_loras: int | None = None
    max_loras_per_batch: int = 8
    enable_lora_overlap_loading: bool = False
    hicache_storage_backend_extra_config: str | None = None
    enable_hisparse: bool = False
    hisparse_config: str | None = None
    enable_lmcache: bool = False
    lmcache_config_file: str | None = None
    enable_flexkv: bool = False
    flexkv_config_file: str | None = None

    @property
    def data_parallel_replicas(self) -> int:
        """Plain-DP replicas: each is a whole tp·pp world with its own pools (docs/sglang.md §1.3).

        With DP attention (`--enable-dp-attention` or `--attn-dp-size`) the dp ranks share the TP
        world and add no processes.
        """
        if self.enable_dp_attention or self.attn_dp_size > 1:
            return 1
        return self.dp_size

    @property
    def world_ranks(self) -> int:
        """Scheduler processes across all nodes."""
        return self.tp_size * self.pp_size * self.data_parallel_replicas

    @property
    def local_ranks(self) -> int:
        """Scheduler processes on this node, each allocating its own host pool."""
        return self.world_ranks // self.nnodes

    @property
    def attention_tp_size(self) -> int:
        """TP degree the attention heads are split over (DP attention divides it)."""
        attn_dp = self.attn_dp_size
        if self.enable_dp_attention and attn_dp == 1:
            attn_dp = self.dp_size
        return max(1, self.tp_size // attn_dp)

    @property
    def effective_page_size(self) -> int:
        return self.page_size or 1

    @property
    def uses_hicache(self) -> bool:
        return self.enable_hierarchical_cache

    @property
    def hicache_mode(self) -> str:
        """How SGLang sizes the host pool: "size", "ratio" or "auto" (size wins over ratio)."""
        if self.hicache_size_gb > 0:
            return "size"
        if "hicache_ratio" in self.given:
            return "ratio"
        return "auto"

    @property
    def on_cpu(self) -> bool:
        """`--device cpu`: the ranks use host memory and no GPU, and what SGLang calls "avail
        mem" is host RAM (get_available_gpu_memory's cpu branch, utils/common.py)."""
        return self.device == "cpu"

    def local_gpu_ids(self) -> tuple[int, ...]:
        """GPU index of each local scheduler, as SGLang maps them (docs/sglang.md §3); none on
        `--device cpu`."""
        if self.on_cpu:
            return ()
        tp_per_node = max(1, self.tp_size // self.nnodes) if self.pp_size == 1 else self.tp_size
        pp_per_node = max(1, self.pp_size // self.nnodes) if self.pp_size > 1 else 1
        ids: list[int] = []
        for _dp in range(self.data_parallel_replicas):
            for pp_rank in range(pp_per_node):
                for tp_rank in range(tp_per_node):
                    # SGLang: base + (pp_rank % pp_per_node) * tp_per_node
                    #              + (tp_rank % tp_per_node) * gpu_id_step
                    ids.append(
                        self.base_gpu_id
                        + pp_rank * tp_per_node
                        + tp_rank * self.gpu_id_step
                        + _dp * tp_per_node * pp_per_node * self.gpu_id_step
                    )
        return tuple(ids)


def _default_rules() -> CliRules:
    """Argv read after the start (already checked then): the newest table, unknown flags kept."""
    rules = rules_for_version(None).cli()
    return CliRules(rules.table, passthrough_unknown=True, yaml_any_spelling=True)


def parse_launch_args(
    argv: Sequence[str],
    rules: CliRules | None = None,
    config: Mapping[str, Any] | None = None,
) -> LaunchPlan:
    """Interpret the memory and topology flags of a launch_server argv.

    `config` is the mapping of the YAML file named by `--config`, when there is one (the
    caller reads files; this function merges them as SGLang does).

    Raises:
        ArgvError: what SGLang's parser refuses (its own message), a value the supervisor cannot
            use (the flag named), or two flags that contradict each other.
    """
    rules = rules or _default_rules()
    merged = tuple(argv)
    if config is not None:
        merged = merge_yaml(argv, config, rules.table, all_spellings=rules.yaml_any_spelling)
    try:
        parsed = parse_cli(merged, rules)
    except ArgvError as exc:
        raise ArgvError(f"{exc}{_spelling_hint(merged, rules.table)}") from None
    values: dict[str, object] = {}
    for option in OPTIONS:
        flag = next((f for n in option.names if (f := rules.table.flag(n)) is not None), None)
        if flag is None or flag.dest not in parsed.values:
            continue
        raw = parsed.values[flag.dest]
        if option.convert is None:
            values[option.dest] = bool(raw)
            continue
        try:
            values[option.dest] = option.convert(raw)
        except ValueError as exc:
            hint = f" ({option.reason})" if option.reason else ""
            raise ArgvError(f"{option.names[0]} {shown(raw)}: {exc}{hint}") from None
    secret_dests = _secret_dests(rules.table)
    plan = LaunchPlan(
        argv=tuple(argv),
        given=frozenset(values),
        repeated=parsed.repeated,
        unknown=parsed.unknown,
        secrets=tuple(str(v) for d, v in parsed.values.items() if d in secret_dests and v),
        **values,  # type: ignore[arg-type]  # each converter returns its field's type
    )
    _check_consistency(plan)
    return plan


def _spelling_hint(argv: Sequence[str], table: CliTable) -> str:
    """Name the right spelling of `--tp_size`-style tokens (argparse only says "unrecognized")."""
    fixes = []
    for token in argv:
        name = token.partition("=")[0]
        if name.startswith("--") and "_" in name and name not in table.by_name:
            flag = table.flag(name.replace("_", "-"))
            if flag is not None:
                fixes.append(f"{name} as {flag.names[0]}")
    return f" (SGLang spells {', '.join(fixes)})" if fixes else ""


# Scheduler processes of one deployment, at most: no SGLang server spans more GPUs, and the
# plan lists every local rank's GPU (a --tp of 10^11 was a list of 10^11 entries: a hang).
MAX_WORLD_RANKS = 65536


def _check_consistency(plan: LaunchPlan) -> None:
    if plan.world_ranks > MAX_WORLD_RANKS:
        raise ArgvError(
            f"--tp-size {plan.tp_size} × --pp-size {plan.pp_size} × {plan.data_parallel_replicas} "
            f"data-parallel replicas is {plan.world_ranks:,} ranks, more than the "
            f"{MAX_WORLD_RANKS:,} of any deployment"
        )
    if plan.node_rank >= plan.nnodes:
        raise ArgvError(
            f"contradicting flags: --node-rank {plan.node_rank} needs --nnodes above it "
            f"(got --nnodes {plan.nnodes})"
        )
    if (plan.tp_size * plan.pp_size) % plan.nnodes:
        raise ArgvError(
            f"contradicting flags: --tp-size {plan.tp_size} × --pp-size {plan.pp_size} does not "
            f"divide over --nnodes {plan.nnodes}"
        )
    if plan.attn_dp_size > 1 and plan.tp_size % plan.attn_dp_size:
        raise ArgvError(
            f"contradicting flags: --attn-dp-size {plan.attn_dp_size} must divide "
            f"--tp-size {plan.tp_size}"
        )


def _table(table: CliTable | None) -> CliTable:
    return table or _default_rules().table


def with_flag_value(
    argv: Sequence[str], flag: str, value: str, table: CliTable | None = None
) -> tuple[str, ...]:
    """Return argv with every occurrence of `flag` (any alias or abbreviation) set to `value`.

    The flag is appended when absent; nothing else in argv moves.
    """
    table = _table(table)
    target = table.flag(flag)
    out = list(argv)
    hits = [s for s in option_spans(argv, table) if target is not None and s[1].dest == target.dest]
    for index, _flag, token, value_indexes in reversed(hits):
        if "=" in token or not value_indexes:
            out[index] = f"{token.partition('=')[0]}={value}"
        else:
            out[value_indexes[0]] = value
    if not hits:
        out.extend([flag, value])
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _secret_dests(table: CliTable) -> frozenset[str]:
    return frozenset(f.dest for f in table.flags if is_secret_flag(f))


@functools.lru_cache(maxsize=8)
def secret_flag_names(table: CliTable | None = None) -> frozenset[str]:
    """Every spelling of every secret flag of the release (sglang_flags.is_secret_flag)."""
    return frozenset(n for f in _table(table).flags if is_secret_flag(f) for n in f.names)


def redact_argv(argv: Sequence[str], table: CliTable | None = None) -> tuple[str, ...]:
    """argv with the values of secret flags (`--api-key`, `--ssl-keyfile-password`, ...)
    replaced by ***, abbreviations and `--flag=value` included."""
    table = _table(table)
    out = list(argv)
    secret_dests = _secret_dests(table)
    for index, flag, token, value_indexes in option_spans(argv, table):
        if flag.dest not in secret_dests:
            continue
        if "=" in token:
            out[index] = token.partition("=")[0] + "=***"
        for i in value_indexes:
            out[i] = "***"
    # Belt and braces for spellings the table does not resolve (e.g. after a stray "--").
    names = secret_flag_names(table)
    for i, token in enumerate(out):
        name, eq, _value = token.partition("=")
        if token in names and i + 1 < len(out):
            out[i + 1] = "***"
        elif eq and name in names:
            out[i] = f"{name}=***"
    return tuple(out)
