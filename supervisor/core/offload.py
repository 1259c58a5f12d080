"""Host memory SGLang's weight offloaders pin: `--cpu-offload-gb` and layer offload.

`--cpu-offload-gb N` is N × 1024³ bytes per rank, GiB not GB (utils/offloader.py:68-72). The
offloader walks the rank's decoder layers in order and moves one parameter after another to
pinned host memory until the bytes moved reach that limit; the limit is checked before each
parameter, so the last one moved may overshoot it (utils/offloader.py:153-181). Layer offload
(`--offload-group-size G`, `--offload-num-in-group N`) moves the MoE experts of the last N layers
of every group of G (utils/offloader.py:251), the only submodule SGLang names for it
(models/deepseek_v2.py:2973-2995).

Each parameter is its own pinned block, and torch's pinned allocator rounds a block up to a power
of two (SGLang's own note, mem_cache/pool_host/common.py:312-313): the host holds the sum of the
rounded blocks, up to twice the bytes moved. The blocks are SGLang's parameters, which fuse the
checkpoint's tensors: q/k/v into `qkv_proj`, gate/up into `gate_up_proj`, every expert of a layer
into one `w13`/`w2` (layers/moe), MLA's `q_a_proj` and `kv_a_proj_with_mqa` into one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from supervisor.core.weights import is_replicated

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
# Towers beside the language model: their layers are not the decoder's (make_layers).
_NOT_DECODER = re.compile(r"vision|visual|audio|mm_projector|multi_modal")
# Checkpoint names to the parameter SGLang loads them into.
_FUSIONS = (
    (re.compile(r"\.experts\.\d+\."), ".experts."),
    (re.compile(r"(?<![a-z])(?:q|k|v)_proj\b"), "qkv_proj"),
    (re.compile(r"\b(?:gate_proj|up_proj|w1|w3)\b"), "gate_up_proj"),
    (re.compile(r"\b(?:q_a_proj|kv_a_proj_with_mqa)\b"), "fused_qkv_a_proj_with_mqa"),
)
# MLA keeps `kv_b_proj` on the GPU: w_kc/w_vc are derived from it (utils/offloader.py:111-119).
_RESIDENT = re.compile(r"\bkv_b_proj\.")


@dataclass(frozen=True, slots=True)
class Block:
    """One of SGLang's parameters on one rank: its name within the layer and its bytes."""

    name: str
    bytes: int

    @property
    def is_expert_weight(self) -> bool:
        """`w13_weight`/`w2_weight` of a FusedMoE, what layer offload moves."""
        return ".experts." in f".{self.name}" and self.name.endswith("weight")


def pinned_block_bytes(size: int) -> int:
    """What torch's pinned allocator takes for a block of `size` bytes: the next power of two."""
    return 0 if size <= 0 else 1 << (size - 1).bit_length()


def stage_layers(num_layers: int, pp_size: int) -> int:
    """The layers of the largest pipeline stage (the last stages take the remainder,
    distributed/utils.py:113-116)."""
    return -(-max(0, num_layers) // max(1, pp_size))


def rank_layer_blocks(
    tensor_bytes: Mapping[str, int], *, tp_size: int, pp_size: int, num_layers: int
) -> tuple[tuple[Block, ...], ...]:
    """The parameters of one rank's decoder layers, layer by layer in SGLang's order.

    A fused parameter is the sum of its tensors, split over TP unless SGLang replicates it.
    Layers past `num_layers` (the checkpoint's MTP layers) belong to the draft and are left out.
    """
    count = min(stage_layers(num_layers, pp_size), max(0, num_layers))
    layers: list[dict[str, int]] = [{} for _ in range(count)]
    for name, size in tensor_bytes.items():
        match = _LAYER.search(name)
        if match is None or int(match.group(1)) >= count or _RESIDENT.search(match.group(2)):
            continue
        if _NOT_DECODER.search(name):
            continue
        key = match.group(2)
        for pattern, fused in _FUSIONS:
            key = pattern.sub(fused, key)
        share = size if is_replicated(name) else size // max(1, tp_size)
        layer = layers[int(match.group(1))]
        layer[key] = layer.get(key, 0) + share
    return tuple(tuple(Block(k, v) for k, v in layer.items()) for layer in layers)


def cpu_offload_pinned_bytes(limit_bytes: int, layers: Sequence[Sequence[Block]]) -> int:
    """Pinned host bytes of one rank under `--cpu-offload-gb` (limit in bytes), as
    OffloaderV1.maybe_offload_to_cpu moves the parameters (utils/offloader.py:144-181)."""
    moved = pinned = 0
    for layer in layers:
        for block in layer:
            if moved >= limit_bytes:
                return pinned
            moved += block.bytes
            pinned += pinned_block_bytes(block.bytes)
    return pinned


def offloaded_layers(stage_layer_count: int, group_size: int, num_in_group: int) -> int:
    """How many of a stage's layers layer offload moves (utils/offloader.py:251)."""
    if group_size <= 0:
        return 0
    return sum(1 for i in range(stage_layer_count) if i % group_size >= group_size - num_in_group)


def layer_offload_bytes(
    layers: Sequence[Sequence[Block]], group_size: int, num_in_group: int, *, pinned: bool
) -> int:
    """Host bytes of the experts layer offload moves: pinned blocks (mode `cpu`,
    `sharded_gpu`) or shared memory of the exact size (`shm_cpu`, utils/host_shared_memory.py)."""
    total = 0
    for index, layer in enumerate(layers):
        if group_size <= 0 or index % group_size < group_size - num_in_group:
            continue
        for block in layer:
            if block.is_expert_weight:
                total += pinned_block_bytes(block.bytes) if pinned else block.bytes
    return total


def cpu_offload_host_bytes(
    limit_bytes: int, layers: Sequence[Sequence[Block]] | None, weights_bytes: int | None
) -> int:
    """Pinned host bytes per rank under `--cpu-offload-gb`: the rounded blocks when the rank's
    parameters are known, else torch's worst case, twice what is moved."""
    if limit_bytes <= 0:
        return 0
    if layers is not None:
        return cpu_offload_pinned_bytes(limit_bytes, layers)
    moved = limit_bytes if weights_bytes is None else min(limit_bytes, weights_bytes)
    return 2 * moved
