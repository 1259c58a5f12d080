"""HiCache's storage tiers and HiSparse: Mooncake's segment, the file backend on a tmpfs, hf3fs
client buffers, HiSparse's host pool; numbers worked by hand from SGLang 0.5.23's source."""

from __future__ import annotations

import dataclasses

import pytest

from supervisor.core.checks import Status
from supervisor.core.host_consumers import ConsumerError, ConsumerFacts, StorageDir
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.sglang_sizes import file_size_bytes, segment_bytes
from supervisor.core.storage_consumers import file_backend_dir, storage_consumers
from supervisor.core.units import GB, GiB, MiB
from tests.core.test_host_consumers import check, counted

FACTS = ConsumerFacts(
    env={}, weights_per_rank_bytes=17 * GB, device_tokens=1_000_000, bytes_per_token=40_960
)


def plan(*args: str):
    return parse_launch_args(["--model-path", "m", "--tp", "8", "--enable-hicache", *args])


def mooncake(*args: str, env: dict[str, str] | None = None):
    facts = dataclasses.replace(FACTS, env=env or {})
    return storage_consumers(plan("--hicache-storage-backend", "mooncake", *args), facts)


# --- Mooncake ------------------------------------------------------------------------------


def test_mooncakes_default_4_gib_segment_is_split_over_tp_with_a_16_mib_buffer_per_rank():
    store = counted(mooncake(), "mooncake")
    assert store.each_bytes == 4 * GiB // 8 + 16 * MiB == 553_648_128
    assert (store.holders, store.bytes, store.per_rank) == (8, 8 * 553_648_128, True)
    assert "MOONCAKE_GLOBAL_SEGMENT_SIZE" in store.detail


def test_mooncake_reads_the_servers_environment_gb_as_gib_and_a_bare_number_as_bytes():
    assert counted(
        mooncake(env={"MOONCAKE_GLOBAL_SEGMENT_SIZE": "64gb"}), "mooncake"
    ).each_bytes == (8 * GiB + 16 * MiB)
    bare = mooncake(env={"MOONCAKE_GLOBAL_SEGMENT_SIZE": "8000000000"})
    assert counted(bare, "mooncake").each_bytes == 1_000_000_000 + 16 * MiB


def test_mooncake_divides_by_attention_tp_under_dp_attention_and_by_pp():
    dp_attention = counted(mooncake("--dp", "8", "--enable-dp-attention"), "mooncake")
    assert dp_attention.each_bytes == 4 * GiB + 16 * MiB  # attention TP 1
    pp = counted(mooncake("--tp", "4", "--pp-size", "2"), "mooncake")
    assert pp.each_bytes == 4 * GiB // 8 + 16 * MiB


def test_mooncake_extra_config_with_a_master_sets_its_own_size_and_ignores_the_environment():
    extra = '{"master_server_address": "10.0.0.1:50051", "global_segment_size": "16gb"}'
    found = mooncake(
        "--hicache-storage-backend-extra-config", extra,
        env={"MOONCAKE_GLOBAL_SEGMENT_SIZE": "64gb"},
    )  # fmt: skip
    assert counted(found, "mooncake").each_bytes == 2 * GiB + 16 * MiB
    without = '{"master_server_address": "10.0.0.1:50051"}'
    found = mooncake("--hicache-storage-backend-extra-config", without)
    assert counted(found, "mooncake").each_bytes == 4 * GiB // 8 + 16 * MiB


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("--hicache-storage-backend-extra-config", "@/etc/mc.json"), {}, "@/etc/mc.json"),
        ((), {"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": "/etc/mc.json"}, "/etc/mc.json"),
        ((), {"MOONCAKE_STANDALONE_STORAGE": "true"}, "standalone_storage"),
    ],
)
def test_mooncake_sized_elsewhere_is_warned_about(args, env, named):
    found = mooncake(*args, env=env)
    assert found.counted == []
    assert check(found, "mooncake").status is Status.WARN
    assert named in check(found, "mooncake").detail


@pytest.mark.parametrize(
    ("value", "message"),
    [("4GiB", "integer of bytes"), ("gb", "integer of bytes"), ("-1", "must not be negative"),
     ("1.5gb", "integer of bytes")],
)  # fmt: skip
def test_a_segment_size_sglang_cannot_read_is_refused_naming_the_variable(value, message):
    with pytest.raises(ConsumerError, match=f"MOONCAKE_GLOBAL_SEGMENT_SIZE={value!r}.*{message}"):
        mooncake(env={"MOONCAKE_GLOBAL_SEGMENT_SIZE": value})


def test_segment_sizes_as_sglang_parses_them():
    assert segment_bytes(" 4GB ", "x") == 4 * GiB
    assert segment_bytes(1024, "x") == 1024
    assert segment_bytes("0", "x") == 0


def test_no_hicache_no_storage_tier():
    args = ["--model-path", "m", "--hicache-storage-backend", "mooncake"]
    assert storage_consumers(parse_launch_args(args), FACTS).counted == []


# --- the file backend ----------------------------------------------------------------------


def file_backend(fs: str | None, free: int | None, env: dict[str, str] | None = None, *args: str):
    storage = StorageDir(path="/tmp/hicache", fs_type=fs, free_bytes=free)
    facts = dataclasses.replace(FACTS, env=env or {}, storage_dir=storage)
    return storage_consumers(plan("--hicache-storage-backend", "file", *args), facts)


def test_a_capped_file_backend_on_tmpfs_counts_the_cap_per_rank():
    found = file_backend("tmpfs", 500 * GiB, {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "10Gi"})
    files = counted(found, "file_backend")
    assert (files.each_bytes, files.holders, files.bytes) == (10 * GiB, 8, 80 * GiB)
    assert check(found, "file_backend").status is Status.OK


def test_caps_that_just_fill_the_tmpfs_are_counted_per_rank():
    env = {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "10Gi"}
    files = counted(file_backend("tmpfs", 80 * GiB, env), "file_backend")
    assert (files.each_bytes, files.holders, files.holder) == (10 * GiB, 8, "rank")


def test_a_cap_beyond_the_tmpfs_counts_what_the_tmpfs_has_free_less_the_watermark():
    env = {
        "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "20G",
        "SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE": "4Gi",
    }
    files = counted(file_backend("tmpfs", 100 * GiB, env), "file_backend")
    assert (files.each_bytes, files.holders, files.holder) == (96 * GiB, 1, "node")


def test_an_uncapped_file_backend_on_tmpfs_counts_its_free_space_and_warns_how_to_cap_it():
    found = file_backend("tmpfs", 100 * GiB)
    assert counted(found, "file_backend").bytes == 100 * GiB
    detail = check(found, "file_backend").detail
    assert check(found, "file_backend").status is Status.WARN
    assert "/tmp/hicache is on tmpfs" in detail
    assert "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE (per rank)" in detail


def test_an_uncapped_file_backend_on_ramfs_is_refused_and_a_capped_one_counted():
    assert check(file_backend("ramfs", 0), "file_backend").status is Status.FAIL
    capped = file_backend("ramfs", 0, {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "1Gi"})
    assert counted(capped, "file_backend").bytes == 8 * GiB


def test_a_tmpfs_whose_free_space_is_unread_warns():
    found = file_backend("tmpfs", None)
    assert found.counted == []
    assert check(found, "file_backend").status is Status.WARN


def test_a_file_backend_on_disk_takes_no_host_memory():
    found = file_backend("ext4", 10**12)
    assert found.counted == []
    assert check(found, "file_backend").status is Status.OK


@pytest.mark.parametrize("fs", [None, "unread"])
def test_a_file_backend_not_read_is_warned_about(fs):
    if fs is None:
        found = storage_consumers(plan("--hicache-storage-backend", "file"), FACTS)
    else:
        found = file_backend(None, None)
    assert found.counted == []
    detail = check(found, "file_backend").detail
    assert "/tmp/hicache" in detail
    assert "× 8" in detail
    assert "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE" in detail


def test_the_file_backends_directory_is_the_environments_then_the_extra_configs():
    extra = ("--hicache-storage-backend-extra-config", '{"file_storage_path": "/dev/shm/kv"}')
    p = plan("--hicache-storage-backend", "file", *extra)
    assert file_backend_dir(p, {}) == "/dev/shm/kv"
    assert (
        file_backend_dir(p, {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": "/nvme/kv"}) == "/nvme/kv"
    )
    assert file_backend_dir(plan(), {}) == "/tmp/hicache"


def test_the_extra_configs_cap_wins_over_the_environment():
    extra = '{"max_size": "1Gi"}'
    env = {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "10Gi"}
    found = file_backend("tmpfs", 500 * GiB, env, "--hicache-storage-backend-extra-config", extra)
    assert counted(found, "file_backend").each_bytes == GiB


@pytest.mark.parametrize(
    ("value", "size"),
    [("200G", 200 * GB), ("1Gi", GiB), ("1.5G", 1_500_000_000), ("1048576", MiB), ("0", 0),
     ("", 0), (None, 0), (3000, 3000)],
)  # fmt: skip
def test_file_sizes_as_sglang_reads_them(value, size):
    assert file_size_bytes(value, "X") == size


@pytest.mark.parametrize("value", ["10 gigs", "1.5Gi", "10g", "-5"])
def test_a_file_cap_sglang_would_ignore_is_refused_naming_the_variable(value):
    env = {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": value}
    with pytest.raises(ConsumerError, match="SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE="):
        file_backend("tmpfs", GiB, env)


# --- hf3fs ---------------------------------------------------------------------------------


def test_hf3fs_buffers_are_16_jobs_2_buffers_8_entries_of_k_pages_per_rank():
    facts = dataclasses.replace(FACTS, env={})
    found = storage_consumers(
        plan("--hicache-storage-backend", "hf3fs", "--page-size", "64"), facts
    )
    buffers = counted(found, "hf3fs")
    # Llama-3-70B at TP 8: 40,960 B/token, the K half 20,480 B, 64-token pages.
    assert buffers.each_bytes == 16 * 2 * 8 * 64 * 20_480 == 335_544_320
    assert (buffers.holders, buffers.per_rank) == (8, True)
    layer_first = ("--page-size", "64", "--hicache-mem-layout", "layer_first")
    found = storage_consumers(plan("--hicache-storage-backend", "hf3fs", *layer_first), facts)
    assert counted(found, "hf3fs").each_bytes == 16 * 2 * 8 * 64 * 40_960


def test_hf3fs_with_a_config_file_or_an_unsized_layout_warns_and_mla_without_one_is_refused():
    env = dataclasses.replace(FACTS, env={"SGLANG_HICACHE_HF3FS_CONFIG_PATH": "/etc/3fs.json"})
    found = storage_consumers(plan("--hicache-storage-backend", "hf3fs"), env)
    assert found.counted == []
    assert "/etc/3fs.json" in check(found, "hf3fs").detail
    head = ("--hicache-storage-backend", "hf3fs", "--hicache-mem-layout", "page_head")
    assert check(storage_consumers(plan(*head), FACTS), "hf3fs").status is Status.WARN
    mla = dataclasses.replace(FACTS, rank_replicated_kv=True)
    found = storage_consumers(plan("--hicache-storage-backend", "hf3fs"), mla)
    assert check(found, "hf3fs").status is Status.FAIL


# GPT-OSS-120B and Qwen3-Next-80B at TP 8 (tests/preflight/test_hybrid.py): 4,608 B a token in
# both of GPT-OSS's pools; Qwen3-Next's attention layers 12,288 B a token, a Mamba slot
# 9,658,368 B.
SWA = HybridLayout(kind="swa", full_layers=18, swa_layers=18, full_row_bytes=4608,
                   swa_row_bytes=4608)  # fmt: skip
MAMBA = HybridLayout(kind="mamba", full_layers=12, mamba_layers=36, full_row_bytes=12_288,
                     mamba_slot_bytes=9_658_368)  # fmt: skip


def test_hf3fs_maps_a_page_of_each_pool_of_a_hybrid_model():
    """storage_hf3fs.py:582-603: each pool but the anchor gets its own 16 clients, paged by its
    K part; a Mamba pool's pages are one slot's whole state."""
    swa = dataclasses.replace(FACTS, bytes_per_token=4608, layout=SWA)
    hf3fs = ("--hicache-storage-backend", "hf3fs", "--page-size", "64")
    buffers = counted(storage_consumers(plan(*hf3fs), swa), "hf3fs")
    assert buffers.each_bytes == 16 * 2 * 8 * (64 * 2304 + 64 * 2304) == 75_497_472
    assert "the SWA pool's 64-token pages of 2,304 B/token (K)" in buffers.detail
    layer_first = plan(*hf3fs, "--hicache-mem-layout", "layer_first")
    # The anchor's whole row with layer_first; the SWA pool's K half all the same (:588).
    each = counted(storage_consumers(layer_first, swa), "hf3fs").each_bytes
    assert each == 16 * 2 * 8 * (64 * 4608 + 64 * 2304)
    mamba = dataclasses.replace(FACTS, bytes_per_token=12_288, layout=MAMBA)
    one = plan("--hicache-storage-backend", "hf3fs")
    buffers = counted(storage_consumers(one, mamba), "hf3fs")
    assert buffers.each_bytes == 16 * 2 * 8 * (6144 + 9_658_368) == 2_474_115_072
    env = dataclasses.replace(mamba, env={"SGLANG_HICACHE_HF3FS_CONFIG_PATH": "/etc/3fs.json"})
    assert "for each pool of the model" in check(storage_consumers(one, env), "hf3fs").detail


# --- HiSparse ------------------------------------------------------------------------------


DSA = dataclasses.replace(FACTS, bytes_per_token=656 * 61, indexer_bytes_per_token=132 * 61)


def test_hisparse_holds_ratio_times_the_device_pool_page_aligned():
    p = parse_launch_args(["--model-path", "m", "--enable-hisparse", "--page-size", "64"])
    pool = counted(storage_consumers(p, DSA), "hisparse")
    # int(1,000,000 x 2) // 64 + 1 pages of 64 tokens (mem_cache/pool_host/base.py:226-229).
    assert pool.each_bytes == (2_000_000 // 64 + 1) * 64 * 656 * 61 == 2_000_064 * 40_016
    three = parse_launch_args([*p.argv, "--hisparse-config", '{"host_to_device_ratio": 3}'])
    assert counted(storage_consumers(three, DSA), "hisparse").each_bytes == 3_000_064 * 40_016


def test_hisparse_outside_dsa_or_without_a_device_pool_warns():
    p = parse_launch_args(["--model-path", "m", "--enable-hisparse"])
    assert check(storage_consumers(p, FACTS), "hisparse").status is Status.WARN
    unknown = dataclasses.replace(DSA, device_tokens=None)
    assert "--gpu-memory" in check(storage_consumers(p, unknown), "hisparse").detail
    # SGLang refuses HiSparse for a hybrid model's pools (arg_groups/hisparse_hook.py:104-107).
    hybrid = dataclasses.replace(DSA, layout=MAMBA)
    found = storage_consumers(p, hybrid)
    assert found.counted == []
    assert "mamba hybrid" in check(found, "hisparse").detail


@pytest.mark.parametrize("ratio", ["0", "-1", '"two"', "true"])
def test_a_hisparse_ratio_that_is_not_a_positive_number_is_refused(ratio):
    p = parse_launch_args(
        [
            "--model-path",
            "m",
            "--enable-hisparse",
            "--hisparse-config",
            f'{{"host_to_device_ratio": {ratio}}}',
        ]
    )
    with pytest.raises(ConsumerError, match="--hisparse-config host_to_device_ratio"):
        storage_consumers(p, DSA)
