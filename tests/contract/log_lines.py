"""Lines as SGLang prints them, one or more per mark the supervisor reads (core/log_phases.py).

Each is checked twice: the supervisor must recognise it, and the release must be able to print
it (tests/contract/test_log_lines.py). `anchor` narrows the search to files containing it;
`files` are all the files under sglang/ that print it, each checked on its own (a line printed
in two places must still be printed in both); `since` is the first release that prints it,
`until` the last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from supervisor.core.log_phases import PHRASES, LogMark


@dataclass(frozen=True, slots=True)
class Line:
    mark: LogMark
    text: str
    anchor: str
    files: tuple[str, ...]
    since: str | None = None
    until: str | None = None  # the last release that prints it
    # The words the supervisor keys on (default: the phrase of core/log_phases.py it contains).
    keys: str | None = None

    @property
    def key_words(self) -> list[str]:
        keys = self.keys
        if keys is None:
            keys = next(p.text for p in PHRASES if p.text in self.text.lower())
        return [w for w in re.split(r"[^a-z0-9-]+", keys.lower()) if w]


LINES: tuple[Line, ...] = (
    Line(
        LogMark.MEMORY_BASELINE,
        "Memory baseline taken. mem usage=1.52 GB",
        "Memory baseline",
        files=("srt/distributed/bootstrap.py",),
        since="0.5.21",
    ),
    Line(
        LogMark.WEIGHTS_LOAD_BEGIN,
        "Load weight begin. avail mem=93.56 GB",
        "Load weight begin",
        files=("srt/model_executor/model_runner.py",),
    ),
    Line(
        LogMark.WEIGHTS_LOADED,
        "Load weight end. elapsed=81.20 s, type=KimiK25ForConditionalGeneration, "
        "avail mem=19.73 GB, mem usage=72.04 GB.",
        "Load weight end",
        files=("srt/model_executor/model_runner.py",),
    ),
    Line(  # the weights committed after the graphs (startup weight load)
        LogMark.WEIGHTS_LOADED,
        "Load weight end. Committed real weights after CUDA graph capture in 3.20 s "
        "(capture overlap window 1.10 s, startup overlap total 9.00 s)",
        "Committed real weights",
        files=("srt/model_executor/model_runner_components/startup_weight_load.py",),
    ),
    Line(
        LogMark.KV_CACHE_ALLOCATED,
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 159000, KV size: 10.41 GB",
        "is allocated",
        files=("srt/mem_cache/memory_pool.py",),
    ),
    Line(
        LogMark.KV_CACHE_ALLOCATED,
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 618574, K size: 12.37 GB, "
        "V size: 12.37 GB",
        "is allocated",
        files=("srt/mem_cache/memory_pool.py",),
    ),
    Line(
        LogMark.HOST_POOL_ALLOCATED,
        "Allocating kv hierarchical KV host pool: 683061 tokens, 48.00 GB host memory.",
        "hierarchical KV host pool",
        files=("srt/mem_cache/pool_host/base.py",),
        keys="Allocating host pool tokens",
    ),
    Line(
        LogMark.HICACHE_AUTO_SIZED,
        "HiCache auto-sizing: ratio 2.000 -> 1.244; 41.6 GiB host memory per rank "
        "(fraction 0.80, 8 ranks on this host), host pools 31.6 GiB.",
        "HiCache auto-sizing",
        files=("srt/mem_cache/hicache_auto_size.py",),
        since="0.5.21",
    ),
    Line(
        LogMark.GRAPH_CAPTURE_BEGIN,
        "Capture target prefill CUDA graph begin. backend=fa3, num_tokens=[512, 1024, 2048], "
        "avail mem=19.21 GB",
        "Capture {capture_name}",
        files=("srt/model_executor/model_runner_components/cuda_graph_setup.py",),
        keys="Capture graph begin",
    ),
    Line(
        LogMark.GRAPH_CAPTURE_END,
        "Capture target prefill CUDA graph end. elapsed=12.84 s, mem usage=0.97 GB, "
        "avail mem=18.24 GB.",
        "Capture {capture_name}",
        files=("srt/model_executor/model_runner_components/cuda_graph_setup.py",),
        keys="Capture graph end",
    ),
    Line(
        LogMark.READY,
        "The server is fired up and ready to roll!",
        "fired up",
        files=(
            "multimodal_gen/runtime/entrypoints/http_server.py",
            "multimodal_gen/runtime/server_warmup.py",
            "srt/entrypoints/http_server.py",
        ),
    ),
    Line(
        LogMark.HOST_MEMORY_REFUSED,
        "Not enough host memory available. Requesting 300.00 GB but only have 54.21 GB free. "
        "Please reduce the size of the hierarchical cache.",
        "Not enough host memory available",
        files=("srt/mem_cache/pool_host/base.py", "srt/mem_cache/pool_host/mamba.py"),
    ),
    Line(
        LogMark.PINNING_FAILED,
        "cudaHostRegister failed (rc=2, out of memory) at offset=0 size=1073741824 "
        "(total=48000062592, chunk_limit=1073741824); host buffer is not pinned and device "
        "transfers may silently return stale data.",
        "cudaHostRegister failed",
        files=("srt/mem_cache/pool_host/common.py",),
        since="0.5.19",
    ),
    Line(
        LogMark.PINNING_FAILED,
        "cudaHostRegister failed (rc=2, out of memory) for ptr=140228 size=1073741824; host "
        "buffer is not pinned and device transfers may silently return stale data.",
        "cudaHostRegister failed",
        files=("srt/mem_cache/pool_host/common.py",),
        until="0.5.18",
    ),
    Line(
        LogMark.PINNING_FAILED,
        "hipHostMalloc of 48.00 GB for a HiCache host pool failed (rc=2, out of memory). With "
        "HSA_USERPTR_FOR_PAGED_MEM=0 host pools are GTT memory, which all ranks on a node share "
        "up to /sys/class/drm/card*/device/mem_info_gtt_total. Reduce --hicache-size or unset "
        "HSA_USERPTR_FOR_PAGED_MEM.",
        "hipHostMalloc of",
        files=("srt/mem_cache/pool_host/common.py",),
        since="0.5.22",
    ),
    Line(
        LogMark.GPU_OOM,
        "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7. "
        "Raise --mem-fraction-static above 0.812 (minimum viable = 1 - available/pre = 0.8110). "
        "If using speculative decoding, draft weights are now counted.",
        "Loaded weights leave no GPU memory",
        files=("srt/mem_cache/kv_cache_configurator.py",),
    ),
    Line(
        LogMark.GPU_OOM,
        "Not enough memory. Please try to increase --mem-fraction-static.",
        "Not enough memory. Please try",
        files=("srt/model_executor/pool_configurator.py",),
    ),
    Line(
        LogMark.SCHEDULER_EXCEPTION,
        "Scheduler hit an exception: Traceback (most recent call last):",
        "Scheduler hit an exception",
        files=("srt/managers/scheduler.py",),
    ),
    Line(
        LogMark.RANK_DIED_AT_INIT,
        "Rank 3 scheduler died during initialization (exit code: -9). If exit code is -9 "
        "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
        "died during initialization",
        files=("srt/entrypoints/engine.py",),
    ),
    Line(
        LogMark.SUBPROCESS_CRASHED,
        "Subprocess scheduler_0 (pid=4242) crashed with exit code -15. "
        "Triggering SIGQUIT for cleanup...",
        "Triggering SIGQUIT",
        files=("srt/utils/watchdog.py",),
        keys="Subprocess pid crashed with exit code",
    ),
    Line(
        LogMark.SIGQUIT,
        "SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
        "It usually means one child failed",
        files=("srt/managers/tokenizer_manager.py",),
    ),
    Line(
        LogMark.SIGQUIT,
        "Received sigquit from a child process. It usually means the child failed.",
        "Received sigquit",
        files=("srt/entrypoints/engine.py",),
    ),
    Line(
        LogMark.KILLS_OWN_TREE,
        "kill_process_tree called: parent_pid=4200, include_parent=True, pid=4200",
        "kill_process_tree called",
        files=("srt/utils/common.py",),
        keys="kill_process_tree called parent_pid include_parent pid",
    ),
    Line(
        LogMark.WARMUP_FAILED,
        "Initialization failed. warmup error: Traceback (most recent call last):",
        "Initialization failed",
        files=("srt/entrypoints/http_server.py",),
    ),
)
