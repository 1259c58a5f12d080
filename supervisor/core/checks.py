"""The pre-flight's answer: checks (ok/warn/fail), the FitReport, its JSON and its table.

Also the small pure decisions behind each host check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from supervisor.core.measured import Deployment
from supervisor.core.shm_space import ShmNeed, ShmSpace, mib
from supervisor.core.units import GB, GiB, format_gb

# NCCL's troubleshooting guide asks a container for `--shm-size=1g`: its SHM transport opens
# several channels per pair of GPUs, more than the one buffer per pair core.shm_space counts.
SHM_MIN_BYTES = 1 * GiB
# cudaHostRegister pins through the driver, but some stacks mlock; below 64 MiB is the distro
# default (8 MiB on many) and worth a warning.
MEMLOCK_WARN_BYTES = 64 * 1024 * 1024


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Check:
    """One named check with a one-line reason."""

    name: str
    status: Status
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail}


def check_memlock(limit_bytes: int | None, readable: bool = True, ipc_lock: bool = False) -> Check:
    """`ipc_lock`: the server inherits CAP_IPC_LOCK, which lifts RLIMIT_MEMLOCK for pinning."""
    if not readable:
        return Check("memlock", Status.WARN, "RLIMIT_MEMLOCK unreadable")
    if limit_bytes is None:
        return Check("memlock", Status.OK, "RLIMIT_MEMLOCK unlimited")
    if ipc_lock:
        return Check(
            "memlock",
            Status.OK,
            f"RLIMIT_MEMLOCK {limit_bytes // 1024} KiB, lifted by CAP_IPC_LOCK",
        )
    status = Status.WARN if limit_bytes < MEMLOCK_WARN_BYTES else Status.OK
    hint = " (LimitMEMLOCK=infinity or ulimit -l unlimited)" if status is Status.WARN else ""
    return Check("memlock", status, f"RLIMIT_MEMLOCK {limit_bytes // 1024} KiB{hint}")


def check_shm(space: ShmSpace | None, need: ShmNeed) -> Check:
    """/dev/shm's free space against what the launch puts there (core/shm_space.py): less than
    SGLang's own segments is a refusal (the ranks die of SIGBUS at init), less than NCCL's share
    too a warning (NCCL uses it only between GPUs that cannot talk peer to peer)."""
    if space is None:
        return Check("shm", Status.WARN, "/dev/shm missing or unreadable (SGLang and NCCL use it)")
    free, size = space.free_bytes, space.size_bytes
    have = f"/dev/shm has {mib(free)} free ({free:,} B) of {mib(size)}"
    made_of = "; ".join(need.parts)
    if free < need.sglang_bytes:
        return Check(
            "shm",
            Status.FAIL,
            f"{have}; SGLang's own segments need {mib(need.sglang_bytes)} "
            f"({need.sglang_bytes:,} B: {made_of}): its ranks would die of SIGBUS at init. "
            "Remove what fills it (`du -a /dev/shm`) or enlarge it",
        )
    if free < need.total_bytes:
        return Check(
            "shm",
            Status.WARN,
            f"{have}; the launch may need {mib(need.total_bytes)} ({need.total_bytes:,} B: "
            f"{made_of}): NCCL fails to start without room where its GPUs are not peer to peer",
        )
    if size < SHM_MIN_BYTES and need.nccl_bytes:
        return Check(
            "shm",
            Status.WARN,
            f"{have}, under the 1 GiB NCCL asks of a container (docker --shm-size=1g)",
        )
    return Check("shm", Status.OK, f"{have}; the launch needs about {mib(need.total_bytes)}")


def check_hugepages(
    page_size_env: str | None, free_bytes: int | None, needed_bytes: int | None
) -> Check | None:
    """Only when SGLANG_HUGEPAGE_SIZE is set: the pools come from hugetlb, not MemAvailable."""
    if not page_size_env:
        return None
    if free_bytes is None:
        return Check(
            "hugepages",
            Status.FAIL,
            f"SGLANG_HUGEPAGE_SIZE={page_size_env} but no {page_size_env} hugepages are configured",
        )
    if needed_bytes is not None and needed_bytes > free_bytes:
        return Check(
            "hugepages",
            Status.FAIL,
            f"SGLANG_HUGEPAGE_SIZE={page_size_env}: pools need {format_gb(needed_bytes)}, "
            f"{format_gb(free_bytes)} of hugepages free",
        )
    return Check(
        "hugepages",
        Status.OK,
        f"SGLANG_HUGEPAGE_SIZE={page_size_env}: {format_gb(free_bytes)} of hugepages free",
    )


def check_gpu_holders(holders: Mapping[int, Sequence[int | str]], gpus_read: bool = True) -> Check:
    """Processes already on the target GPUs (NVML PIDs or /dev/nvidiaN holders).

    `gpus_read` False: no GPU was read (backend none, or the GPU facts given), so NVML's process
    lists were not seen; an empty answer then proves nothing and says so (a warning).
    """
    if not holders and not gpus_read:
        detail = (
            "not checked: no GPU was read (NVML's process lists unseen); no process has "
            "/dev/nvidiaN of the target GPUs open"
        )
        return Check("gpu_holders", Status.WARN, detail)
    if not holders:
        return Check("gpu_holders", Status.OK, "no process holds the target GPUs")
    shown = ", ".join(
        f"pid {pid} ({', '.join(str(g) for g in gpus)})"
        for pid, gpus in sorted(holders.items())[:5]
    )
    more = f" and {len(holders) - 5} more" if len(holders) > 5 else ""
    return Check("gpu_holders", Status.FAIL, f"target GPUs already in use: {shown}{more}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """One line of the arithmetic: a label and a signed number of bytes."""

    label: str
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FitReport:
    """Everything the pre-flight concluded; `to_json()` is the documented schema."""

    model: str
    attention: str
    kv_cache_dtype: str
    layers_per_rank: int
    local_ranks: int
    bytes_per_token_per_rank: int
    indexer_bytes_per_token_per_rank: int
    weights_per_rank_bytes: int | None
    gpu_memory_bytes: int | None
    gpu_free_bytes: int | None  # free before weights, CUDA context off (F, docs/sglang.md §1.4)
    mem_fraction_static: float | None
    device_tokens_per_rank: int | None
    hicache_mode: str  # off | size | ratio | auto
    hicache_ratio: float | None
    host_pool_tokens_per_rank: int | None
    host_pool_bytes_per_rank: int | None
    host_required_bytes: int | None
    host_budget_bytes: int
    terms: tuple[Term, ...]
    max_hicache_size_gb: int
    equivalent_ratio: float | None
    safe_host_tokens_per_rank: int
    avg_request_tokens: int
    sglang_version: str | None
    checks: tuple[Check, ...]
    sglang_rules: str = ""  # whose rules were applied (SglangRules.describe)
    device_tokens_source: str = "estimate"  # "measured": from a previous run's own log
    deployment: Deployment | None = None  # what a measurement of this launch is filed under
    suggested_argv: tuple[str, ...] | None = None
    numa: tuple[dict[str, int], ...] = field(default_factory=tuple)
    # The host (and each NUMA node) has room for the launch with no host pool at all.
    fits_without_hicache: bool = True
    # Each pool of a rank (core/pools.py Pool.to_json): "kv" for a model of one pool; "full",
    # "swa" or "mamba" beside "kv" for a hybrid model. Tokens (Mamba: slots) and bytes, on the
    # GPU and in host memory.
    pools: tuple[Mapping[str, object], ...] = ()
    # SGLang's opt-in host consumers counted in the budget (core/host_consumers.py Consumer).
    host_consumers: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    @property
    def fits(self) -> bool:
        return all(c.status is not Status.FAIL for c in self.checks)

    @property
    def verdict(self) -> str:
        return "fit" if self.fits else "no-fit"

    @property
    def safe_concurrent_requests(self) -> int:
        return self.safe_host_tokens_per_rank // max(1, self.avg_request_tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "model": self.model,
            "attention": self.attention,
            "kv_cache_dtype": self.kv_cache_dtype,
            "layers_per_rank": self.layers_per_rank,
            "local_ranks": self.local_ranks,
            "bytes_per_token_per_rank": self.bytes_per_token_per_rank,
            "indexer_bytes_per_token_per_rank": self.indexer_bytes_per_token_per_rank,
            "weights_per_rank_bytes": self.weights_per_rank_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "gpu_free_bytes": self.gpu_free_bytes,
            "mem_fraction_static": self.mem_fraction_static,
            "device_tokens_per_rank": self.device_tokens_per_rank,
            "hicache_mode": self.hicache_mode,
            "hicache_ratio": self.hicache_ratio,
            "host_pool_tokens_per_rank": self.host_pool_tokens_per_rank,
            "host_pool_bytes_per_rank": self.host_pool_bytes_per_rank,
            "host_required_bytes": self.host_required_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "arithmetic": [{"term": t.label, "bytes": t.bytes} for t in self.terms],
            "max_hicache_size_gb": self.max_hicache_size_gb,
            "equivalent_ratio": self.equivalent_ratio,
            "safe_host_tokens_per_rank": self.safe_host_tokens_per_rank,
            "avg_request_tokens": self.avg_request_tokens,
            "safe_concurrent_requests": self.safe_concurrent_requests,
            "numa": [dict(n) for n in self.numa],
            "pools": [dict(p) for p in self.pools],
            "host_consumers": [dict(c) for c in self.host_consumers],
            "sglang_version": self.sglang_version,
            "sglang_rules": self.sglang_rules,
            "device_tokens_source": self.device_tokens_source,
            "suggested_argv": list(self.suggested_argv) if self.suggested_argv else None,
            "checks": [c.to_json() for c in self.checks],
        }

    def render_table(self) -> str:
        """The human-readable report: the arithmetic term by term, the safe size, the checks."""
        lines = [f"sglang-supervisor preflight: {'FIT' if self.fits else 'NO FIT'}", ""]
        lines += self._plan_lines()
        lines += ["", "  host memory (GB = 1e9 bytes)", *self._arithmetic_lines(), ""]
        lines += self._safe_size_lines()
        lines += ["", "  checks"]
        lines += [f"    {c.status.value:<5} {c.name:<14} {c.detail}" for c in self.checks]
        return "\n".join(lines)

    def _plan_lines(self) -> list[str]:
        indexer = self.indexer_bytes_per_token_per_rank
        hybrid = self._is_hybrid
        lines = [
            f"  model             {self.model}",
            f"  KV cell           {self.bytes_per_token_per_rank:,} B/token/rank "
            + ("in the full pool " if hybrid else "")
            + f"({self.attention}, {self.layers_per_rank} layers, {self.kv_cache_dtype})"
            + (f" + DSA indexer {indexer:,} B" if indexer else ""),
            f"  local ranks       {self.local_ranks} (each allocates its own host pool)",
        ]
        if self.sglang_rules:
            lines.insert(1, f"  rules             {self.sglang_rules}")
        if self.device_tokens_per_rank is None:
            lines.append("  device KV         unknown (no GPU memory read or given)")
        else:
            gpu = format_gb(self.gpu_free_bytes) if self.gpu_free_bytes is not None else "?"
            weights = self.weights_per_rank_bytes
            shared = (
                "shared by the pools below" if hybrid else f"/ {self.bytes_per_token_per_rank:,} B"
            )
            lines.append(
                f"  device KV         {self.device_tokens_per_rank:,} tokens/rank "
                f"((GPU free {gpu} × {self.mem_fraction_static} − weights "
                f"{format_gb(weights) if weights is not None else 'unknown'}) {shared})"
            )
        lines.append(self._pool_line())
        return lines + self._hybrid_pool_lines()

    @property
    def _is_hybrid(self) -> bool:
        return any(p.get("pool") not in ("kv", "indexer") for p in self.pools)

    def _hybrid_pool_lines(self) -> list[str]:
        """One line per pool of a hybrid model (a model of one pool has them above)."""
        if not self._is_hybrid:
            return []
        lines = ["  pools per rank"]
        for pool in self.pools:
            device, row = _count(pool.get("device")), _count(pool.get("row_bytes")) or 0
            size = "?" if device is None else f"{device:,}"
            text = f"    {pool.get('pool')!s:<5} {size} {pool.get('unit')} × {row:,} B"
            if (device_bytes := _count(pool.get("device_bytes"))) is not None:
                text += f" = {format_gb(device_bytes)} on the GPU"
            if (host := _count(pool.get("host"))) is not None:
                text += f"; host {host:,} = {format_gb(host * row)}"
            lines.append(text)
        return lines

    def _pool_line(self) -> str:
        mode = self.hicache_mode
        if mode == "off":
            return "  host pool         HiCache off (--enable-hierarchical-cache not given)"
        if self.host_pool_bytes_per_rank is None:
            return f"  host pool         {mode} mode: cannot be sized (device pool unknown)"
        ratio = f", ratio {self.hicache_ratio:.3g}" if self.hicache_ratio is not None else ""
        return (
            f"  host pool         {format_gb(self.host_pool_bytes_per_rank)}/rank "
            f"({self.host_pool_tokens_per_rank:,} tokens, {mode} mode{ratio})"
        )

    def _arithmetic_lines(self) -> list[str]:
        width = max([len(t.label) for t in self.terms] + [20])
        lines = []
        for i, term in enumerate(self.terms):
            sign = " " if i == 0 else ("−" if term.bytes < 0 else "+")
            lines.append(f"    {sign} {term.label:<{width}} {abs(term.bytes) / GB:>12,.1f} GB")
        left = sum(t.bytes for t in self.terms)
        lines.append(f"    = {'left after the launch':<{width}} {left / GB:>12,.1f} GB")
        return lines

    def _safe_size_lines(self) -> list[str]:
        if self.max_hicache_size_gb <= 0:
            advice = (
                "; leave HiCache off"
                if self.fits_without_hicache
                else ", and the launch does not fit even without HiCache"
            )
            return [f"  safe --hicache-size: none, not even 1 GB per rank fits{advice}"]
        ratio_text = (
            f", ≈ --hicache-ratio {self.equivalent_ratio:.2f}"
            if self.equivalent_ratio is not None
            else ""
        )
        return [
            f"  safe --hicache-size {self.max_hicache_size_gb} (GB per rank{ratio_text})",
            f"    buys {self.safe_host_tokens_per_rank:,} host tokens/rank ≈ "
            f"{self.safe_concurrent_requests:,} requests of {self.avg_request_tokens:,} tokens",
        ]


def _count(value: object) -> int | None:
    """A pool's number from its JSON form, None when absent."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
