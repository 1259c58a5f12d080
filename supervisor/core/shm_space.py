"""What a launch needs in /dev/shm, and whether the free space there holds it.

A tmpfs gives its pages on first touch: `multiprocessing.shared_memory` only ftruncates a
segment, so a process that maps more than is free learns it when it writes into the missing part,
and dies of SIGBUS (SGLang says as much where it guards its multimodal segments against it,
srt/managers/mm_utils.py lines 1382-1386). The free space (statvfs f_bavail), not the size of the
file system (f_blocks), is what counts: a full /dev/shm of normal size kills the ranks at init.

What SGLang 0.5.23 puts there at init, from its source (docs/sglang.md, "/dev/shm"):
- the TP group's broadcast queue, `sgl_shm_mq_*`: `GroupCoordinator.__init__`
  (srt/distributed/parallel_state.py line 566) calls
  `MessageQueue.create_from_process_group(cpu_group, 1 << 22, 6)`; the writer (TP rank 0) makes
  a `ShmRingBuffer` of `(max_chunk_bytes + 1 + n_local_readers) × max_chunks` bytes when the group
  has readers on its node (srt/distributed/device_communicators/shm_broadcast.py lines 94-107 and
  199-203): one per TP group, unless SGLANG_USE_MESSAGE_QUEUE_BROADCASTER is false;
- the schedulers' load snapshot, `/dev/shm/sglang_loads_*.shm`: a 12-byte header and 16 KiB per
  DP rank (srt/managers/load_snapshot.py lines 285-307 and 333);
- with `--tokenizer-worker-num` > 1, the pickled server arguments for the workers,
  `multi_tokenizer_args_<pid>` (srt/managers/multi_tokenizer_mixin.py lines 959-976 and 1001):
  tens of KiB; TOKENIZER_ARGS_BYTES is counted.
Multimodal inputs (`sgl_shm_mm_*`) come later, per request, and SGLang falls back to another
transport when /dev/shm is full (srt/managers/mm_utils.py lines 1510-1520): not counted.

NCCL (its user guide, "Troubleshooting: Shared memory" and NCCL_BUFFSIZE, NCCL_SHM_DISABLE):
NCCL makes segments in /dev/shm and fails to initialize without room ("failed to extend
/dev/shm/nccl-... to 4194660 bytes"); its SHM transport, used between two GPUs that cannot reach
each other peer to peer, holds a buffer of NCCL_BUFFSIZE (4 MiB by default) for each pair of
GPUs, each way. That is what is counted: one buffer per ordered pair of local ranks of one NCCL
world. It is a floor where NCCL opens several channels per pair, and nothing where every pair is
peer to peer or NCCL keeps the buffers in cuMem host memory (NCCL_CUMEM_HOST_ENABLE): so too
little room for it is a warning, while too little for SGLang's own segments is a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from supervisor.core.sglang_facts import MESSAGE_QUEUE_BROADCASTER_ENV
from supervisor.core.units import KiB, MiB

if TYPE_CHECKING:  # the pre-flight's checks import this module: no more than they need
    from supervisor.core.sglang_args import LaunchPlan

PAGE_BYTES = 4 * KiB  # tmpfs charges whole pages
MQ_CHUNK_BYTES = 1 << 22  # parallel_state.py: create_from_process_group(cpu_group, 1 << 22, 6)
MQ_CHUNKS = 6
LOAD_HEADER_BYTES = 12  # load_snapshot.py HEADER_STRUCT "<4sHHI"
LOAD_SLOT_BYTES = 16 * KiB  # load_snapshot.py SLOT_SIZE
TOKENIZER_ARGS_BYTES = 256 * KiB  # the pickled ServerArgs and PortArgs: tens of KiB
NCCL_BUFFSIZE_DEFAULT = 4 * MiB  # NCCL_BUFFSIZE's documented default
_FALSE = ("false", "0", "no", "n")  # SGLang's EnvBool (srt/environ.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShmSpace:
    """statvfs of /dev/shm: the file system's size and what an unprivileged process may still
    allocate there."""

    size_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShmNeed:
    """What the launch puts in this node's /dev/shm at init."""

    sglang_bytes: int  # SGLang's own segments: certain
    nccl_bytes: int  # NCCL's SHM transport, where it is used: an estimate
    parts: tuple[str, ...]  # what the numbers are made of, for the message

    @property
    def total_bytes(self) -> int:
        return self.sglang_bytes + self.nccl_bytes


def _pages(size: int) -> int:
    return -(-size // PAGE_BYTES) * PAGE_BYTES


def _nccl_buffsize(env: Mapping[str, str]) -> int:
    text = env.get("NCCL_BUFFSIZE", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else NCCL_BUFFSIZE_DEFAULT


def launch_need(plan: LaunchPlan, env: Mapping[str, str]) -> ShmNeed:
    """What `plan` needs in this node's /dev/shm (`env`: the server's environment)."""
    spans_nodes = plan.pp_size == 1 and plan.nnodes > 1  # TP split over nodes
    tp_here = max(1, plan.tp_size // plan.nnodes) if spans_nodes else plan.tp_size
    stages_here = max(1, plan.pp_size // plan.nnodes) if plan.pp_size > 1 else 1
    groups = plan.data_parallel_replicas * stages_here  # TP groups with ranks on this node
    parts: list[str] = []
    sglang = _pages(LOAD_HEADER_BYTES + plan.dp_size * LOAD_SLOT_BYTES)
    parts.append(f"load snapshot {sglang // KiB} KiB")
    queue_on = env.get(MESSAGE_QUEUE_BROADCASTER_ENV, "1").strip().lower() not in _FALSE
    writers_here = groups if not spans_nodes or plan.node_rank == 0 else 0
    if queue_on and tp_here > 1 and writers_here:
        ring = _pages((MQ_CHUNK_BYTES + 1 + tp_here - 1) * MQ_CHUNKS)
        sglang += writers_here * ring
        parts.append(f"{writers_here} TP broadcast queue(s) of {ring / MiB:.1f} MiB")
    if plan.tokenizer_worker_num > 1 and plan.node_rank == 0:
        sglang += TOKENIZER_ARGS_BYTES
        parts.append(f"tokenizer workers' arguments {TOKENIZER_ARGS_BYTES // KiB} KiB")
    ranks = tp_here * stages_here  # of one NCCL world on this node
    nccl = 0
    if env.get("NCCL_SHM_DISABLE", "").strip() != "1" and ranks > 1:
        buffsize = _nccl_buffsize(env)
        pairs = ranks * (ranks - 1)
        nccl = plan.data_parallel_replicas * pairs * buffsize
        parts.append(
            f"NCCL {plan.data_parallel_replicas * pairs} rank pair(s) x {buffsize / MiB:g} MiB"
        )
    return ShmNeed(sglang_bytes=sglang, nccl_bytes=nccl, parts=tuple(parts))


def mib(size: int) -> str:
    return f"{size / MiB:,.1f} MiB"
