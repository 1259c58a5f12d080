"""Names the supervisor relies on in SGLang: process titles, environment variables, endpoints.

Log phrases live with their reader (core/log_phases.py). tests/contract checks every name here,
and every `SGLANG_*` and `sglang::` string anywhere in the supervisor, against each release's
source; docs/sglang.md says what each one is for.
"""

from __future__ import annotations

# setproctitle prefixes: every titled subprocess, and the schedulers (one per local rank,
# sglang::scheduler[_DP0][_PP0][_ATTN_CP0][_MOE_DP0][_TP0][_EP0], managers/scheduler.py).
TITLE_PREFIX = "sglang::"
SCHEDULER_TITLE_PREFIX = "sglang::scheduler"
# With more than one DP rank the schedulers may be children of this process instead of the main
# process (managers/data_parallel_controller.py `run_data_parallel_controller_process`).
DP_CONTROLLER_TITLE = "sglang::data_parallel_controller"

# Crash path: py-spy dump and CUDA core dump before SGLang kills its tree (about 65 s with the
# GPUs held); the supervisor sets both to 0 unless [server] crash_dumps = true.
CRASH_DUMP_ENV = ("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "SGLANG_PYSPY_DUMP_BEFORE_CRASH")
# Host pools from hugetlb pages instead of ordinary memory (mem_cache/pool_host).
HUGEPAGE_ENV = "SGLANG_HUGEPAGE_SIZE"
# GPU memory held back for a multimodal model's embedding cache, in MB.
VLM_CACHE_ENV = "SGLANG_VLM_CACHE_SIZE_MB"

# HTTP endpoints the supervisor calls on the server (entrypoints/http_server.py).
HEALTH_ENDPOINTS = ("/health", "/health_generate")
# Each is a one-token generation that the handler first looks at after `asyncio.sleep(1)`, then
# once a second until SGLANG_HEALTH_CHECK_TIMEOUT (0.5.23 `health_generate`, lines 721-800): a
# 200 takes at least this long, and each probe is a prefill on the server.
HEALTH_FIRST_LOOK_S = 1.0

# NUMA binding of the schedulers (utils/numa_utils.py); both default to on.
NUMA_BIND_V2_ENV = "SGLANG_NUMA_BIND_V2"  # bind by running each scheduler under numactl
AUTO_NUMA_BIND_ENV = "SGLANG_AUTO_NUMA_BIND"  # bind without --numa-node, nodes from NVML

# The TP group's broadcast queue in /dev/shm (distributed/parallel_state.py); on by default.
MESSAGE_QUEUE_BROADCASTER_ENV = "SGLANG_USE_MESSAGE_QUEUE_BROADCASTER"
