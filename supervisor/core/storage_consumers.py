"""Host memory of HiCache's storage tiers and of HiSparse, beside the host KV pool.

`--hicache-storage-backend` adds a tier below the host pool; three of SGLang 0.5.23's backends
hold host memory of their own: Mooncake's store segment, the `file` backend when its directory is
on a tmpfs, and the hf3fs client buffers. HiSparse keeps a host pool of its own. The numbers are
SGLang's (each cited where it is used); the environment is the one the server will get.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.core.checks import Check, Status
from supervisor.core.host_consumers import Consumer, ConsumerError, ConsumerFacts, Found, StorageDir
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.sglang_sizes import file_size_bytes, segment_bytes
from supervisor.core.units import MiB, format_gb

SEGMENT_ENV = "MOONCAKE_GLOBAL_SEGMENT_SIZE"  # environ.py:886, default "4gb"
STANDALONE_ENV = "MOONCAKE_STANDALONE_STORAGE"  # environ.py:891
MOONCAKE_CONFIG_ENV = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
FILE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"  # environ.py:828
FILE_MAX_ENV = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"  # environ.py:830
FILE_MIN_FREE_ENV = "SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE"  # environ.py:832
HF3FS_CONFIG_ENV = "SGLANG_HICACHE_HF3FS_CONFIG_PATH"  # environ.py:825
FILE_DEFAULT_DIR = "/tmp/hicache"  # mem_cache/hicache_storage.py:730
# The client's local buffer beside its segment (mem_cache/storage/mooncake_store/
# mooncake_store.py:31, passed to setup at 573).
MOONCAKE_LOCAL_BUFFER_BYTES = 16 * MiB
# hf3fs without a config file: 16 client jobs, 8 entries each
# (mem_cache/storage/hf3fs/storage_hf3fs.py:316-326).
HF3FS_JOBS, HF3FS_ENTRIES = 16, 8
# Filesystems whose files are host memory.
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def storage_consumers(plan: LaunchPlan, facts: ConsumerFacts) -> Found:
    """The storage tier of `--hicache-storage-backend`, and HiSparse's host pool.

    Raises:
        ConsumerError: a size SGLang would refuse or silently ignore, or a bad --hisparse-config.
    """
    found = Found()
    backend = plan.hicache_storage_backend if plan.uses_hicache else None
    extra = extra_config(plan)
    if backend == "mooncake":
        _mooncake(plan, facts, extra, found)
    elif backend == "file":
        _file_backend(plan, facts, extra, found)
    elif backend == "hf3fs":
        _hf3fs(plan, facts, found)
    _hisparse(plan, facts, found)
    return found


def extra_config(plan: LaunchPlan) -> Mapping[str, Any] | None:
    """`--hicache-storage-backend-extra-config` as SGLang reads it; None for `@file`
    (mem_cache/hybrid_cache/hybrid_cache_controller.py:378-402), {} when not given."""
    text = plan.hicache_storage_backend_extra_config
    if not text:
        return {}
    if text.startswith("@"):
        return None
    parsed = json.loads(text)  # the argv reader checked it is a JSON object
    return parsed if isinstance(parsed, dict) else {}


@dataclass(frozen=True, slots=True)
class _Segment:
    raw: object  # as written
    where: str  # where it came from, for the report
    name: str  # what to name in an error
    standalone: bool


def _segment_source(
    plan: LaunchPlan, facts: ConsumerFacts, extra: Mapping[str, Any] | None
) -> _Segment | str:
    """The segment's size and where it comes from, or the file that sizes it instead
    (mem_cache/storage/mooncake_store/mooncake_store.py:324-344)."""
    if extra is None:
        return f"--hicache-storage-backend-extra-config {plan.hicache_storage_backend_extra_config}"
    if any(extra.get(k) is not None for k in ("master_server_address", "client_server_address")):
        return _Segment(
            extra.get("global_segment_size", "4gb"),
            "the extra config's global_segment_size",
            "--hicache-storage-backend-extra-config global_segment_size",
            bool(extra.get("standalone_storage")),
        )
    if MOONCAKE_CONFIG_ENV in facts.env:
        return f"{MOONCAKE_CONFIG_ENV}={facts.env[MOONCAKE_CONFIG_ENV]}"
    raw = facts.env.get(SEGMENT_ENV, "4gb")
    where = f"{SEGMENT_ENV}={raw}" if SEGMENT_ENV in facts.env else "the 4 GiB default"
    # EnvBool (environ.py:143-150); anything else falls back to its default, False.
    standalone = facts.env.get(STANDALONE_ENV, "").lower() in ("true", "1", "yes", "y")
    return _Segment(raw, where, SEGMENT_ENV, standalone)


def _mooncake(
    plan: LaunchPlan, facts: ConsumerFacts, extra: Mapping[str, Any] | None, found: Found
) -> None:
    """Each rank's client gives the store segment ÷ (attention TP × PP) of host memory
    (mem_cache/storage/mooncake_store/mooncake_store.py:446-454) plus its local buffer."""
    source = _segment_source(plan, facts, extra)
    if isinstance(source, str):
        found.warn(
            "mooncake",
            f"Mooncake store: the segment is sized by {source} (global_segment_size, 4 GiB "
            f"when absent), ÷ TP × PP per rank × {plan.local_ranks} local ranks: not read here, "
            "not counted. Bound it with that file's global_segment_size",
        )
        return
    if source.standalone:
        found.warn(
            "mooncake",
            "Mooncake standalone_storage: the segment lives in the separate mooncake_client "
            "process (mem_cache/storage/mooncake_store/mooncake_store.py:498-510), outside "
            "this launch: not counted",
        )
        return
    segment = segment_bytes(source.raw, source.name)
    scale = plan.attention_tp_size * plan.pp_size
    each = segment // scale + MOONCAKE_LOCAL_BUFFER_BYTES
    detail = (
        f"Mooncake store segment {format_gb(segment)} ({source.where}) ÷ {scale} "
        "(attention TP × PP) "
        f"+ 16 MiB local buffer per rank, × {plan.local_ranks} local ranks; bound it with "
        f'{SEGMENT_ENV} ("<N>gb" is GiB, a bare number bytes)'
    )
    found.count(
        Consumer(
            name="mooncake",
            flag="--hicache-storage-backend mooncake",
            each_bytes=each,
            holders=plan.local_ranks,
            holder="rank",
            per_rank=True,
            detail=detail,
        )
    )


def file_backend_dir(plan: LaunchPlan, env: Mapping[str, str]) -> str:
    """Where the file backend writes (mem_cache/hicache_storage.py:730-736)."""
    extra = extra_config(plan) or {}
    return env.get(FILE_DIR_ENV) or str(extra.get("file_storage_path") or "") or FILE_DEFAULT_DIR


def _file_backend(
    plan: LaunchPlan, facts: ConsumerFacts, extra: Mapping[str, Any] | None, found: Found
) -> None:
    """Files are host memory on a tmpfs: each rank writes up to its cap, with none the tmpfs's
    free space (less SGLang's own watermark, mem_cache/storage/file/lru_file_evictor.py:261-280)."""
    config = extra or {}
    if extra is None:
        found.warn(
            "file_backend",
            f"--hicache-storage-backend-extra-config {plan.hicache_storage_backend_extra_config}:"
            " its file_storage_path, max_size and min_free_space are not read here (the "
            "environment's are used); keep the directory's cap there or in "
            f"{FILE_MAX_ENV}",
        )
    cap = _file_setting(config, "max_size", facts.env, FILE_MAX_ENV)
    min_free = _file_setting(config, "min_free_space", facts.env, FILE_MIN_FREE_ENV)
    where = file_backend_dir(plan, facts.env)
    bound = f"bound it with {FILE_MAX_ENV} (per rank) or a directory on disk ({FILE_DIR_ENV})"
    storage = facts.storage_dir
    if storage is None or storage.fs_type is None:
        why = "not read when planning another box" if storage is None else "its filesystem unread"
        found.warn(
            "file_backend",
            f"the file storage backend writes to {where}, host memory when that is a tmpfs "
            f"({why}); {'capped' if cap else 'uncapped'} per rank × {plan.local_ranks}: {bound}",
        )
    elif storage.fs_type not in MEMORY_FILESYSTEMS:
        detail = (
            f"the file storage backend writes to {where} on {storage.fs_type}: disk, not host "
            "memory"
        )
        found.checks.append(Check("file_backend", Status.OK, detail))
    else:
        _tmpfs_files(plan, storage, cap, min_free, bound, found)


def _file_setting(config: Mapping[str, Any], key: str, env: Mapping[str, str], name: str) -> int:
    """The extra config's key, else the variable, in bytes
    (mem_cache/storage/file/lru_file_evictor.py:117-127)."""
    if config.get(key) is not None:
        return file_size_bytes(config[key], f"--hicache-storage-backend-extra-config {key}")
    return file_size_bytes(env.get(name), name)


def _tmpfs_files(
    plan: LaunchPlan, storage: StorageDir, cap: int, min_free: int, bound: str, found: Found
) -> None:
    ranks = plan.local_ranks
    room = None
    if storage.fs_type == "tmpfs" and storage.free_bytes is not None:
        room = max(0, storage.free_bytes - min_free)
    on = f"{storage.path} is on {storage.fs_type}: the file storage backend's files are host memory"
    if not cap and room is None:
        # ramfs has no size limit; a tmpfs whose free space could not be read is only unknown.
        ramfs = storage.fs_type == "ramfs"
        detail = f"{on}, and {'nothing bounds them' if ramfs else 'its free space is unread'}"
        found.checks.append(
            Check("file_backend", Status.FAIL if ramfs else Status.WARN, f"{detail}: {bound}")
        )
        return
    if cap and (room is None or cap * ranks <= room):
        each, holders, holder = cap, ranks, "rank"
        how = f"{format_gb(cap)} cap per rank × {ranks} local ranks"
    else:
        each, holders, holder = room or 0, 1, "node"
        how = f"up to the {format_gb(room or 0)} the {storage.fs_type} has free"
    detail = f"{on}: {how}; {bound}"
    consumer = Consumer(
        name="file_backend",
        flag="--hicache-storage-backend file",
        each_bytes=each,
        holders=holders,
        holder=holder,
        per_rank=False,
        detail=detail,
    )
    found.count(consumer, Status.OK if cap else Status.WARN)


def _hf3fs(plan: LaunchPlan, facts: ConsumerFacts, found: Found) -> None:
    """Each client job of each rank maps a read and a write buffer of `entries` pages, in
    /dev/shm (mem_cache/storage/hf3fs/hf3fs_usrbio_client.py:86-115, storage_hf3fs.py:239-250),
    and as many jobs again for each other pool of a hybrid model (storage_hf3fs.py:582-603).
    """
    jobs = f"client jobs × 2 × entries × page bytes per rank × {plan.local_ranks} local ranks"
    if facts.layout is not None:
        jobs += ", for each pool of the model"
    if HF3FS_CONFIG_ENV in facts.env:
        found.warn(
            "hf3fs",
            f"hf3fs buffers: {jobs}, numjobs and entries from {HF3FS_CONFIG_ENV}="
            f"{facts.env[HF3FS_CONFIG_ENV]} (mem_cache/storage/hf3fs/storage_hf3fs.py:311-372): "
            "not read here, not counted. Bound them with that file's numjobs and entries",
        )
        return
    if facts.rank_replicated_kv:
        detail = (
            f"SGLang refuses hf3fs for an MLA model without {HF3FS_CONFIG_ENV} naming a "
            "metadata_server_url (mem_cache/storage/hf3fs/storage_hf3fs.py:311-314, 356-359)"
        )
        found.checks.append(Check("hf3fs", Status.FAIL, detail))
        return
    pages = _hf3fs_pages(plan, facts)
    if pages is None:
        detail = (
            f"SGLang 0.5.23 sizes hf3fs pages only for page_first, page_first_direct and "
            f"layer_first (mem_cache/storage/backend_factory.py:194-206), not "
            f"{plan.hicache_mem_layout}"
        )
        found.warn("hf3fs", detail)
        return
    each = HF3FS_JOBS * 2 * HF3FS_ENTRIES * sum(size for _, size in pages)
    shown = " + ".join(what for what, _ in pages)
    shown = shown if len(pages) == 1 else f"({shown})"
    detail = (
        f"hf3fs buffers: {HF3FS_JOBS} jobs × 2 × {HF3FS_ENTRIES} entries × {shown} "
        f"per rank × {plan.local_ranks} local ranks, in /dev/shm; bound them "
        f"with fewer numjobs or entries ({HF3FS_CONFIG_ENV})"
    )
    found.count(
        Consumer(
            name="hf3fs",
            flag="--hicache-storage-backend hf3fs",
            each_bytes=each,
            holders=plan.local_ranks,
            holder="rank",
            per_rank=True,
            detail=detail,
        )
    )


def _hf3fs_pages(plan: LaunchPlan, facts: ConsumerFacts) -> list[tuple[str, int]] | None:
    """(what, bytes) of one page of each pool hf3fs has clients for; None: a layout SGLang
    gives no page size. The anchor (the one pool, a hybrid's full or attention pool) by the
    layout (backend_factory.py:194-206); every other pool of a hybrid by its K part
    (storage_hf3fs.py:582-588 `get_ksize_per_token`): the K half of an SWA row
    (mem_cache/pool_host/mha.py:302-303), a Mamba slot's whole state, in pages of one slot
    (mem_cache/pool_host/mamba.py:101, 423-424)."""
    cell = facts.bytes_per_token
    page = plan.effective_page_size
    layout = plan.hicache_mem_layout
    if layout in ("page_first", "page_first_direct"):
        row, part = cell // 2, " (the K half)"
    elif layout == "layer_first":
        row, part = cell, ""
    else:
        return None
    pages = [(f"{page}-token pages of {row:,} B/token{part}", page * row)]
    hybrid = facts.layout
    if hybrid is not None and hybrid.kind == "swa":
        swa_k = hybrid.swa_row_bytes // 2
        pages.append((f"the SWA pool's {page}-token pages of {swa_k:,} B/token (K)", page * swa_k))
    elif hybrid is not None and hybrid.kind == "mamba":
        slot = hybrid.mamba_slot_bytes
        pages.append((f"the Mamba pool's one-slot pages of {slot:,} B", slot))
    return pages


def _hisparse(plan: LaunchPlan, facts: ConsumerFacts, found: Found) -> None:
    """HiSparse keeps ratio × the device pool of a DSA model in a host pool of its own, the
    logical pool (managers/hisparse_coordinator.py:617-630, mem_cache/pool_host/base.py:225-229)."""
    if not plan.enable_hisparse:
        return
    ratio = hisparse_ratio(plan)
    if facts.layout is not None:
        found.warn(
            "hisparse",
            f"--enable-hisparse: SGLang accepts it for DSA models, DeepSeek-V4 and MiniMax-M3 "
            f"only (arg_groups/hisparse_hook.py:104-107), not for this {facts.layout.kind} "
            "hybrid's pools: not counted",
        )
        return
    if not facts.indexer_bytes_per_token:
        found.warn(
            "hisparse",
            f"--enable-hisparse: a host pool of {ratio:g} × the device pool per rank × "
            f"{plan.local_ranks} local ranks, sized here for DSA models only (DeepSeek-V4 and "
            "MiniMax-M3 have pools of their own): not counted. Bound it with "
            "--hisparse-config host_to_device_ratio",
        )
        return
    if facts.device_tokens is None:
        found.warn(
            "hisparse",
            f"--enable-hisparse: {ratio:g} × the device pool per rank × {plan.local_ranks} "
            "local ranks, and the device pool is unknown: give --gpus and --gpu-memory",
        )
        return
    page = plan.effective_page_size
    tokens = (int(facts.device_tokens * ratio) // page + 1) * page
    detail = (
        f"--enable-hisparse: {tokens:,} host tokens per rank ({ratio:g} × {facts.device_tokens:,} "
        f"device tokens, page aligned) × {facts.bytes_per_token:,} B, × {plan.local_ranks} local "
        "ranks; bound it with --hisparse-config host_to_device_ratio"
    )
    found.count(
        Consumer(
            name="hisparse",
            flag="--enable-hisparse",
            each_bytes=tokens * facts.bytes_per_token,
            holders=plan.local_ranks,
            holder="rank",
            per_rank=True,
            detail=detail,
        )
    )


def hisparse_ratio(plan: LaunchPlan) -> float:
    """`host_to_device_ratio` of --hisparse-config, 2 by default (mem_cache/sparsity/factory.py:81).

    Raises:
        ConsumerError: not a positive number.
    """
    config = json.loads(plan.hisparse_config) if plan.hisparse_config else {}
    ratio = config.get("host_to_device_ratio", 2) if isinstance(config, dict) else 2
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio > 0:
        raise ConsumerError(
            f"--hisparse-config host_to_device_ratio {ratio!r}: must be a positive number"
        )
    return float(ratio)
