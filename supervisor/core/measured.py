"""What SGLang measured about a launch, read from its own log, and when a later plan may use it.

Per rank SGLang prints (formats checked by tests/contract):
    Load weight end. elapsed=…, type=…, avail mem=A GB, mem usage=W GB.   (GB = GiB here)
    KV Cache is allocated. dtype: …, #tokens: N, K size: … GB, V size: … GB   (or KV size)
    Allocating kv hierarchical KV host pool: H tokens, X GB host memory.
    Memory pool end. avail mem=L GB
A + W is the free GPU memory before the weights (what SGLang sizes the KV pool from), W the
weights on the GPU, N the device KV tokens. A rank reports for itself; the smallest value over
the ranks is the one that binds (SGLang takes the minimum token count over the ranks).

W is a difference of two readings (model_runner.py: free before minus free after the load), so
it comes out negative when something else freed memory meanwhile ("mem usage=-0.00 GB"): signs
are read, and a size is never stored below 0. On `--device cpu` "avail mem" is the host's free
RAM per NUMA node (utils/common.py get_available_gpu_memory, line 490 in 0.5.23): such a
measurement is filed with `device: "cpu"` and never sizes a GPU launch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.units import GiB

# Compiled by the first SizingLog (re caches them), not at import: only `run` reads a launch's
# log, and the pre-flight imports this module for the records alone. Where the numbers come
# after a gap, they are searched from the phrase that opens the line (found with str.find): no
# pattern has a `.*` that would rescan a long line from every start.
# Each (opening phrase, pattern) is the product's; tests/contract binds every one of them, and
# every regex in SIZING_LINES and SIZING_PATTERNS, to the format string printing it in each
# release: a regex SizingLog applies belongs in one of those two tuples, under a public name.
_GB_NUMBER = r"(-?[\d.]+) GB"  # "-0.00 GB" too: a difference of two readings
WEIGHTS_LINE = ("Load weight end.", rf"avail mem={_GB_NUMBER}, mem usage={_GB_NUMBER}")
# Each KV line with the label of its pool, where SGLang prints one: "Full KV Cache is
# allocated" / "SWA KV Cache …" (mem_cache/memory_pool.py:2073-2099 `_finalize_allocation_log`,
# allocation_label "Full" / "SWA" in mem_cache/swa_memory_pool.py:76-95; no label: the model's
# one pool, or a Mamba hybrid's KV pool), and "Allocating full hierarchical KV host pool"
# (pool_host/base.py:261-278, pool_label "kv", "full", "swa", "draft_swa"). The label opens the
# line, so these two are searched from its start; an optional label is a branch with an empty
# side, and the dtype a run of its own characters, so that the search stays linear
# (tests/core/pattern_shape.py).
KV_LINE = ("", r"(?:\b(\w+) |)KV Cache is allocated\. dtype: [\w.]*, #tokens: (\d+)")
HOST_POOL_LINE = ("", r"(?:Allocating (\w+) |)hierarchical KV host pool: (\d+) tokens")
POOL_END_LINE = ("", rf"Memory pool end\. avail mem={_GB_NUMBER}")
# A Mamba hybrid's state pool on the GPU and its host mirror (mem_cache/memory_pool.py:983-1009,
# mem_cache/pool_host/mamba.py:192-197). The host line's GB (decimal) is read only to know the
# line: 0.5.20 prints no slot count there ("(layout=…)"), and the optional slots part has no
# literal word that such a release would fail to check.
MAMBA_LINE = ("Mamba Cache is allocated. ", r"max_mamba_cache_size: (\d+)")
MAMBA_HOST_LINE = (
    "",
    r"Allocating ([\d.]+) GB host memory for hierarchical Mamba cache "
    r"\((?:(\d+) [a-z ]+, )?layout=",
)
RANK_PATTERN = r"\bTP(\d+)\b"  # the scheduler's logger prefix, " TP3"
SIZING_LINES = (  # SizingLog's order
    WEIGHTS_LINE,
    KV_LINE,
    HOST_POOL_LINE,
    POOL_END_LINE,
    MAMBA_LINE,
    MAMBA_HOST_LINE,
)
SIZING_PATTERNS = (RANK_PATTERN, *(p for _, p in SIZING_LINES))
# Which pool a KV line's label names; any other label (or none) is the one pool, "kv".
_KV_LABELS = {"Full": "full", "SWA": "swa"}
# Pools a line can name, so a damaged record cannot grow a plan without bound.
_POOL_NAME_CHARS = 24
# Bounds of the record file: a few launches per deployment, a few deployments per instance.
RECORDS_PER_DEPLOYMENT = 4
RECORDS_MAX = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One launch's numbers, the smallest over its ranks (None: not printed)."""

    pre_load_free_bytes: int | None = None
    weights_bytes: int | None = None
    device_tokens: int | None = None
    host_pool_tokens: int | None = None
    free_after_pools_bytes: int | None = None
    # Where SGLang measured: "gpu", or "cpu" (--device cpu: its "avail mem" is host RAM).
    device: str = "gpu"
    # Each pool apart (tokens; "mamba": state slots), the smallest over the ranks: "kv" (the one
    # pool), "full" and "swa" (sliding window), "mamba", "draft…" (a draft model's, logged after
    # the target's "Memory pool end"). None: a record written before pools were read.
    device_pools: Mapping[str, int] | None = None
    host_pools: Mapping[str, int] | None = None  # by SGLang's host pool label ("kv", "full", …)

    @property
    def complete(self) -> bool:
        return None not in (self.pre_load_free_bytes, self.weights_bytes, self.device_tokens)


class SizingLog:
    """Fed every line of one launch's output; keeps per-rank numbers (a few ints)."""

    def __init__(self) -> None:
        self._ranks: dict[int, dict[str, int]] = {}
        self._rank = re.compile(RANK_PATTERN)
        self._phrases = [(phrase, re.compile(p)) for phrase, p in SIZING_LINES]

    def _found(self, line: str, which: int) -> re.Match[str] | None:
        """The numbers of the `which`-th kind of sizing line, after its opening phrase."""
        phrase, pattern = self._phrases[which]
        at = line.find(phrase)
        return None if at == -1 else pattern.search(line, at + len(phrase))

    def feed(self, line: str) -> None:
        if "mem" not in line and "tokens" not in line and "Mamba" not in line:
            return  # the common case: not a sizing line
        rank_match = self._rank.search(line)
        rank = self._ranks.setdefault(int(rank_match.group(1)) if rank_match else 0, {})
        if (m := self._found(line, 0)) is not None:
            avail, usage = max(0.0, float(m.group(1))), max(0.0, float(m.group(2)))
            rank["pre_load_free_bytes"] = int((avail + usage) * GiB)
            rank["weights_bytes"] = int(usage * GiB)
        elif (m := self._found(line, 1)) is not None:
            self._device_pool(rank, _KV_LABELS.get(m.group(1) or "", "kv"), int(m.group(2)))
        elif (m := self._found(line, 4)) is not None:
            self._device_pool(rank, "mamba", int(m.group(1)))
        elif (m := self._found(line, 2)) is not None:
            rank["host_pool_tokens"] = rank.get("host_pool_tokens", 0) + int(m.group(2))
            rank[f"host:{_host_label(m.group(1))}"] = int(m.group(2))
        elif (m := self._found(line, 5)) is not None and m.group(2) is not None:
            rank["host:mamba"] = int(m.group(2))
        elif (m := self._found(line, 3)) is not None:
            rank["free_after_pools_bytes"] = int(max(0.0, float(m.group(1))) * GiB)
            rank["pool_ends"] = rank.get("pool_ends", 0) + 1

    @staticmethod
    def _device_pool(rank: dict[str, int], name: str, size: int) -> None:
        """A device pool's size. After the rank's first "Memory pool end" a pool is a draft
        model's: its worker sizes its own pools after the target's (model_runner order)."""
        if rank.get("pool_ends"):
            name = "draft" if name == "kv" else f"draft_{name}"
        rank[f"device:{name}"] = size
        if name in ("kv", "full"):
            rank["device_tokens"] = size  # the cache's tokens: the full pool of a hybrid

    def measurement(self) -> Measurement:
        """The binding value of each number: the least free memory and tokens, the most weights."""

        def over_ranks(key: str, pick: Any = min) -> int | None:
            values = [r[key] for r in self._ranks.values() if key in r]
            return pick(values) if values else None

        def pools(prefix: str) -> dict[str, int] | None:
            names = sorted({k for r in self._ranks.values() for k in r if k.startswith(prefix)})
            found = {n.removeprefix(prefix): over_ranks(n) for n in names}
            return {n: v for n, v in found.items() if v is not None} or None

        return Measurement(
            pre_load_free_bytes=over_ranks("pre_load_free_bytes"),
            weights_bytes=over_ranks("weights_bytes", max),
            device_tokens=over_ranks("device_tokens"),
            host_pool_tokens=over_ranks("host_pool_tokens"),
            free_after_pools_bytes=over_ranks("free_after_pools_bytes"),
            device_pools=pools("device:"),
            host_pools=pools("host:"),
        )


def _host_label(label: str | None) -> str:
    """A host pool's label as the record keeps it; none, or one too long to be SGLang's, is
    "kv"."""
    return label if label is not None and len(label) <= _POOL_NAME_CHARS else "kv"


@dataclass(frozen=True, slots=True, kw_only=True)
class Deployment:
    """What a measurement belongs to: model, parallelism, GPU model and SGLang release."""

    model: str
    tp_size: int
    pp_size: int
    gpu_name: str  # "" when the GPUs were not read (planning another box)
    gpu_total_bytes: int | None
    sglang_version: str

    def matches(self, other: Deployment) -> bool:
        same = (self.model, self.tp_size, self.pp_size, self.sglang_version) == (
            other.model,
            other.tp_size,
            other.pp_size,
            other.sglang_version,
        )
        if self.gpu_name and other.gpu_name:
            return same and self.gpu_name == other.gpu_name
        return same and self.gpu_total_bytes == other.gpu_total_bytes


def device_settings(plan: LaunchPlan) -> dict[str, Any]:
    """The flags besides the deployment that size the device pool: a measured token count is
    reused as is only when all of them are the same."""
    return {
        "mem_fraction_static": plan.mem_fraction_static,
        "kv_cache_dtype": plan.kv_cache_dtype,
        "page_size": plan.page_size,
        "max_total_tokens": plan.max_total_tokens,
        "cpu_offload_gb": plan.cpu_offload_gb,
        "speculative_algorithm": plan.speculative_algorithm,
        "chunked_prefill_size": plan.chunked_prefill_size,
    } | {key: getattr(plan, key) for key in _HYBRID_SETTINGS if getattr(plan, key)}


# The flags that size a hybrid model's pools apart (core/pools.py): in the settings only when
# given, so that a record of a launch without them, older than them, still matches one.
_HYBRID_SETTINGS = (
    "swa_full_tokens_ratio",
    "disable_hybrid_swa_memory",
    "mamba_full_memory_ratio",
    "max_mamba_cache_size",
    "mamba_ssm_dtype",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    deployment: Deployment
    settings: Mapping[str, Any]
    measurement: Measurement
    at: float  # seconds since the epoch

    def to_json(self) -> dict[str, Any]:
        return {
            "deployment": asdict(self.deployment),
            "settings": dict(self.settings),
            "measurement": asdict(self.measurement),
            "at": self.at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        """Raises TypeError/KeyError/ValueError on what is not a record."""
        return cls(
            deployment=Deployment(**data["deployment"]),
            settings=dict(data["settings"]),
            measurement=_measurement(data["measurement"]),
            at=float(data["at"]),
        )


def _measurement(data: Mapping[str, Any]) -> Measurement:
    """A measurement from its JSON; its pools (absent from older records) must map short names
    to counts."""
    measured = Measurement(**data)
    for pools in (measured.device_pools, measured.host_pools):
        if pools is None:
            continue
        if not isinstance(pools, Mapping) or len(pools) > RECORDS_MAX:
            raise ValueError(f"pools must be a small mapping, got {pools!r:.80}")
        for name, size in pools.items():
            if not isinstance(name, str) or len(name) > _POOL_NAME_CHARS:
                raise ValueError(f"pool name {name!r:.40} is not one")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"pool {name} size {size!r:.40} is not a count")
    return measured


def add_record(records: Sequence[Record], new: Record) -> tuple[Record, ...]:
    """The records with `new` appended, bounded per deployment and in all (oldest dropped)."""
    same = [r for r in records if r.deployment.matches(new.deployment)]
    others = [r for r in records if not r.deployment.matches(new.deployment)]
    kept = [*same, new][-RECORDS_PER_DEPLOYMENT:]
    return tuple(sorted([*others, *kept], key=lambda r: r.at)[-RECORDS_MAX:])


def latest_for(records: Sequence[Record], deployment: Deployment) -> Record | None:
    """The newest complete GPU measurement of this deployment (one taken on `--device cpu`
    measured host RAM: it never sizes a GPU)."""
    found = [
        r
        for r in records
        if r.deployment.matches(deployment)
        and r.measurement.complete
        and r.measurement.device == "gpu"
    ]
    return max(found, key=lambda r: r.at) if found else None
