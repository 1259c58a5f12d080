"""The numbers and names the pre-flight's opt-in host consumers rest on (core/host_consumers.py,
core/storage_consumers.py, core/offload.py) are in each release's source, taken from the
product's own constants where it has them."""

from __future__ import annotations

import pytest

from supervisor.core import storage_consumers as storage
from supervisor.core.sglang_flags import OFFLOAD_MODES
from supervisor.core.sglang_versions import parse_version
from supervisor.core.units import MiB
from tests.contract.conftest import source_of

# (file under srt/, text, first release with it): what each consumer's arithmetic reads.
MARKERS: tuple[tuple[str, str, str], ...] = (
    # --cpu-offload-gb is GiB, moved parameter by parameter, each its own pinned block.
    (
        "utils/offloader.py",
        "cpu_offload_max_bytes=int(get_exec().offload.cpu_offload_gb * 1024**3)",
        "0.5.18",
    ),
    ("utils/offloader.py", "if self._cpu_offload_bytes >= self._cpu_offload_max_bytes:", "0.5.18"),
    (
        "mem_cache/pool_host/common.py",
        "host allocator rounds each block up to a power of",
        "0.5.22",
    ),
    # layer offload: which layers, and the experts of DeepSeek-V2-style models only
    (
        "utils/offloader.py",
        "if module_index % self.group_size >= self.group_size - self.num_in_group:",
        "0.5.18",
    ),
    ("models/deepseek_v2.py", "layer.mlp.experts", "0.5.18"),
    # the weights backup is the memory saver's
    (
        "utils/torch_memory_saver_adapter.py",
        "_TorchMemorySaverAdapterReal() if enable else _TorchMemorySaverAdapterNoop()",
        "0.5.18",
    ),
    (
        "model_executor/model_runner_components/load_model_utils.py",
        "enable_cpu_backup = get_exec().features.enable_weights_cpu_backup",
        "0.5.19",
    ),
    # KTransformers: TP rank 0 holds the CPU experts; LoRA: every rank copies each adapter
    (
        "layers/moe/kt_ep_wrapper.py",
        "if self.tp_rank == 0:\n            self.wrapper = KTMoEWrapper(",
        "0.5.18",
    ),
    ("lora/lora.py", "self.layers[layer_id].weights[name] = loaded_weight.cpu()", "0.5.18"),
    # Mooncake: the segment's default, its units, its split over the ranks, the local buffer
    ("environ.py", f'{storage.SEGMENT_ENV} = EnvStr("4gb")', "0.5.18"),
    (
        "mem_cache/storage/mooncake_store/mooncake_store.py",
        "return int(num) * 1024 * 1024 * 1024",
        "0.5.18",
    ),
    (
        "mem_cache/storage/mooncake_store/mooncake_store.py",
        "else (storage_config.tp_size * storage_config.pp_size)",
        "0.5.19",
    ),
    (
        "mem_cache/storage/mooncake_store/mooncake_store.py",
        f"DEFAULT_LOCAL_BUFFER_SIZE = {storage.MOONCAKE_LOCAL_BUFFER_BYTES // MiB} * 1024 * 1024",
        "0.5.18",
    ),
    ("managers/cache_controller.py", "attn_tp_size", "0.5.18"),
    # the file backend: its directory, its cap and watermark, their units
    ("mem_cache/hicache_storage.py", f'file_path: str = "{storage.FILE_DEFAULT_DIR}"', "0.5.18"),
    ("mem_cache/hicache_storage.py", f"envs.{storage.FILE_DIR_ENV}.get()", "0.5.18"),
    (
        "mem_cache/storage/file/lru_file_evictor.py",
        f'_cfg("max_size", envs.{storage.FILE_MAX_ENV})',
        "0.5.18",
    ),
    (
        "mem_cache/storage/file/lru_file_evictor.py",
        f'_cfg("min_free_space", envs.{storage.FILE_MIN_FREE_ENV})',
        "0.5.18",
    ),
    (
        "utils/common.py",
        'iec_multiplier = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}',
        "0.5.18",
    ),
    # hf3fs: jobs and entries without a config file, the K half of an MHA row
    ("mem_cache/storage/hf3fs/storage_hf3fs.py", f"numjobs={storage.HF3FS_JOBS},", "0.5.18"),
    ("mem_cache/storage/hf3fs/storage_hf3fs.py", f"entries={storage.HF3FS_ENTRIES},", "0.5.18"),
    (
        "mem_cache/storage/hf3fs/hf3fs_usrbio_client.py",
        "size=self.bs * self.entries, create=True",
        "0.5.18",
    ),
    ("mem_cache/pool_host/mha.py", "return self.get_size_per_token() // 2", "0.5.18"),
    # hf3fs and a hybrid model: as many clients again for each pool but the anchor, paged by
    # its K part; a Mamba pool's K part is a slot's whole state, in pages of one slot
    ("mem_cache/storage/hf3fs/storage_hf3fs.py", "if host_pool_name == PoolName.KV:", "0.5.18"),
    (
        "mem_cache/storage/hf3fs/storage_hf3fs.py",
        "pool_bytes_per_page = host_pool.get_ksize_per_token() * pool_page_size",
        "0.5.18",
    ),
    ("mem_cache/storage/hf3fs/storage_hf3fs.py", "for _ in range(self.numjobs)", "0.5.18"),
    ("mem_cache/pool_host/mamba.py", "self.page_size = 1\n", "0.5.18"),
    (
        "mem_cache/pool_host/mamba.py",
        "def get_ksize_per_token(self):\n        return self.get_size_per_token()\n",
        "0.5.18",
    ),
    # HiSparse: ratio 2 by default, a host pool of ratio x the device pool
    (
        "mem_cache/sparsity/factory.py",
        'host_to_device_ratio = extra_config.pop("host_to_device_ratio", 2)',
        "0.5.18",
    ),
    ("mem_cache/pool_host/base.py", "* host_to_device_ratio)", "0.5.18"),
)


@pytest.mark.parametrize(
    ("path", "text", "since"), MARKERS, ids=[f"{m[0]}:{m[1][:40]}" for m in MARKERS]
)
def test_the_release_has_what_the_consumer_arithmetic_reads(
    version: str, path: str, text: str, since: str
):
    if parse_version(version) < parse_version(since):
        pytest.skip(f"SGLang {version} predates this line ({since}); the arithmetic follows 0.5.23")
    source = (source_of(version) / "srt" / path).read_text(encoding="utf-8")
    assert text in source, f"SGLang {version} {path} lacks {text!r}"


def test_every_offload_mode_the_reader_accepts_is_one_of_sglangs(version: str):
    source = (source_of(version) / "srt" / "utils" / "offloader.py").read_text(encoding="utf-8")
    for mode in OFFLOAD_MODES:
        assert f'"{mode}": _' in source, f"--offload-mode {mode} is not in SGLang {version}"
