"""Read SGLang's `launch_server` argv the way its argparse does, without importing SGLang.

Only the memory and topology flags are interpreted; every other token passes through untouched and
the user's argv is never reordered. Spelling rules mirrored from SGLang (docs/sglang.md §2.1):
names are "--" + field with dashes plus explicit aliases, underscore spellings are not SGLang's,
and argparse's unique-prefix abbreviation is on (`--tp 8` works, `--pp 2` is ambiguous).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from supervisor.core.sglang_flags import ALL_NAMES, BY_NAME, OTHER_FLAGS, Option


class ArgvError(ValueError):
    """The launch_server argv is malformed or contradicts itself (exit 2)."""


# The flags whose values are secrets: redacted in every log line, state file and report.
SECRET_FLAGS: frozenset[str] = frozenset({"--api-key", "--admin-api-key"})


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
    numa_node: str | None = None

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

    def local_gpu_ids(self) -> tuple[int, ...]:
        """GPU index of each local scheduler, as SGLang maps them (docs/sglang.md §3)."""
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


def _resolve_name(token: str) -> str | None:
    """Map an option token to its full name, applying argparse's unique-prefix rule.

    Returns None for tokens that are not one of the interpreted flags (they pass through).

    Raises:
        ArgvError: the abbreviation matches more than one launch_server flag.
    """
    if token in BY_NAME:
        return token
    if token in OTHER_FLAGS:
        return None
    candidates = [name for name in ALL_NAMES if name.startswith(token)]
    if not candidates:
        return None
    targets = {(BY_NAME[c].dest if c in BY_NAME else c) for c in candidates}
    if len(candidates) > 1 and len(targets) > 1:
        raise ArgvError(f"ambiguous option: {token} could match {', '.join(candidates)}")
    first = candidates[0]
    return first if first in BY_NAME else None


def _iter_options(argv: Sequence[str]) -> list[tuple[int, str, Option, str | None, int]]:
    """Find interpreted options: (index, token name, option, value, tokens consumed)."""
    found: list[tuple[int, str, Option, str | None, int]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--") or token == "--":
            i += 1
            continue
        name_part, has_eq, inline = token.partition("=")
        if "_" in name_part and name_part not in BY_NAME:
            dashed = name_part.replace("_", "-")
            if _resolve_name(dashed) is not None:
                raise ArgvError(
                    f"{name_part} is not a launch_server flag: SGLang spells it {dashed}"
                )
        full = _resolve_name(name_part)
        if full is None:
            i += 1
            continue
        opt = BY_NAME[full]
        if opt.convert is None:
            if has_eq:
                raise ArgvError(f"{name_part} takes no value (got {token!r})")
            found.append((i, name_part, opt, None, 1))
            i += 1
            continue
        if has_eq:
            found.append((i, name_part, opt, inline, 1))
            i += 1
            continue
        if i + 1 >= len(argv) or (argv[i + 1].startswith("--") and argv[i + 1] != "--"):
            raise ArgvError(f"{name_part} expects a value")
        found.append((i, name_part, opt, argv[i + 1], 2))
        i += 2
    return found


def parse_launch_args(argv: Sequence[str]) -> LaunchPlan:
    """Interpret the memory and topology flags of a launch_server argv.

    Raises:
        ArgvError: a value of the wrong type, an ambiguous abbreviation, or two flags that
            contradict each other; the message names the flag.
    """
    values: dict[str, object] = {}
    spelled: dict[str, str] = {}
    for _index, name, opt, raw, _consumed in _iter_options(argv):
        if opt.convert is None:
            value: object = True
        else:
            assert raw is not None  # _iter_options always pairs a valued option with its value
            try:
                value = opt.convert(raw)
            except ValueError as exc:
                hint = f" ({opt.reason})" if opt.reason else ""
                raise ArgvError(f"{name} {raw!r}: {exc}{hint}") from None
        if opt.dest in values and values[opt.dest] != value:
            raise ArgvError(
                f"contradicting flags: {spelled[opt.dest]} {values[opt.dest]} and {name} {value}"
            )
        values[opt.dest] = value
        spelled[opt.dest] = name
    plan = LaunchPlan(argv=tuple(argv), given=frozenset(values), **values)  # type: ignore[arg-type]
    _check_consistency(plan)
    return plan


def _check_consistency(plan: LaunchPlan) -> None:
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
    if plan.hicache_host_memory_mode not in ("cache", "buffer_only"):
        raise ArgvError(
            f"--hicache-host-memory-mode {plan.hicache_host_memory_mode!r}: "
            "must be cache or buffer_only"
        )


def with_flag_value(argv: Sequence[str], flag: str, value: str) -> tuple[str, ...]:
    """Return argv with every occurrence of `flag` (any alias or abbreviation) set to `value`.

    The flag is appended when absent; nothing else in argv moves.
    """
    opt = BY_NAME[flag]
    out = list(argv)
    occurrences = [hit for hit in _iter_options(argv) if hit[2].dest == opt.dest]
    for index, name, _opt, _raw, consumed in reversed(occurrences):
        if consumed == 1:
            out[index] = f"{name}={value}"
        else:
            out[index + 1] = value
    if not occurrences:
        out.extend([flag, value])
    return tuple(out)


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """argv with the values of secret flags (`--api-key`, `--admin-api-key`) replaced by ***."""
    out = list(argv)
    try:
        hits = _iter_options(argv)
    except ArgvError:
        hits = []
    for index, _name, opt, _raw, consumed in hits:
        if not any(n in SECRET_FLAGS for n in opt.names):
            continue
        if consumed == 1:
            out[index] = out[index].partition("=")[0] + "=***"
        else:
            out[index + 1] = "***"
    # Belt and braces for spellings the parser does not resolve (e.g. after a stray "--").
    for i, token in enumerate(out):
        if token in SECRET_FLAGS and i + 1 < len(out):
            out[i + 1] = "***"
    return tuple(out)
