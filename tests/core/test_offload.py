"""What SGLang's weight offloaders pin: `--cpu-offload-gb` in GiB and power-of-two blocks, and
the experts of layer offload, against numbers worked by hand from utils/offloader.py."""

from __future__ import annotations

import pytest

from supervisor.core import offload
from supervisor.core.offload import Block
from supervisor.core.units import GiB, MiB

# One Llama-3-70B decoder layer in bf16 (hidden 8192, 64 query heads, 8 KV heads of 128,
# intermediate 28672), the checkpoint's names in SGLang's module order.
LLAMA_LAYER = {
    "self_attn.q_proj.weight": 8192 * 8192 * 2,
    "self_attn.k_proj.weight": 1024 * 8192 * 2,
    "self_attn.v_proj.weight": 1024 * 8192 * 2,
    "self_attn.o_proj.weight": 8192 * 8192 * 2,
    "mlp.gate_proj.weight": 28672 * 8192 * 2,
    "mlp.up_proj.weight": 28672 * 8192 * 2,
    "mlp.down_proj.weight": 28672 * 8192 * 2,
    "input_layernorm.weight": 8192 * 2,
    "post_attention_layernorm.weight": 8192 * 2,
}


def llama_tensors(layers: int = 80) -> dict[str, int]:
    tensors = {"model.embed_tokens.weight": 128256 * 8192 * 2, "lm_head.weight": 128256 * 8192 * 2}
    for i in range(layers):
        tensors |= {f"model.layers.{i}.{name}": size for name, size in LLAMA_LAYER.items()}
    return tensors


def test_a_block_rounds_up_to_the_next_power_of_two():
    assert offload.pinned_block_bytes(20_971_520) == 33_554_432  # 20 MiB -> 32 MiB
    assert offload.pinned_block_bytes(16 * MiB) == 16 * MiB  # a power of two stays
    assert offload.pinned_block_bytes(16 * MiB + 1) == 32 * MiB
    assert offload.pinned_block_bytes(1) == 1
    assert offload.pinned_block_bytes(0) == 0


def test_llama_layers_fuse_qkv_and_gate_up_and_split_over_tp_but_not_the_norms():
    layers = offload.rank_layer_blocks(llama_tensors(), tp_size=8, pp_size=1, num_layers=80)
    assert len(layers) == 80
    assert {b.name: b.bytes for b in layers[0]} == {
        "self_attn.qkv_proj.weight": 20_971_520,  # (128 + 2 x 16) MiB / 8
        "self_attn.o_proj.weight": 16_777_216,
        "mlp.gate_up_proj.weight": 117_440_512,  # 2 x 448 MiB / 8
        "mlp.down_proj.weight": 58_720_256,
        "input_layernorm.weight": 16_384,  # replicated: whole on every rank
        "post_attention_layernorm.weight": 16_384,
    }


def test_one_gib_of_llama_tp8_moves_five_layers_and_one_block_and_pins_1_29_gb():
    layers = offload.rank_layer_blocks(llama_tensors(), tp_size=8, pp_size=1, num_layers=80)
    # A layer moves 213,942,272 B and pins 251,691,008 (32 + 16 + 128 + 64 MiB + 2 x 16 KiB).
    # Five layers move 1,069,711,360 < 1 GiB, so the sixth layer's qkv_proj goes too
    # (utils/offloader.py:164: the limit is checked before each parameter).
    assert offload.cpu_offload_pinned_bytes(GiB, layers) == 5 * 251_691_008 + 33_554_432
    assert offload.cpu_offload_pinned_bytes(GiB, layers) == 1_292_009_472


def test_an_offload_larger_than_the_rank_moves_every_layer_and_stops():
    layers = offload.rank_layer_blocks(llama_tensors(2), tp_size=8, pp_size=1, num_layers=2)
    assert offload.cpu_offload_pinned_bytes(100 * GiB, layers) == 2 * 251_691_008


def test_without_the_tensor_list_the_count_is_twice_what_moves():
    assert offload.cpu_offload_host_bytes(5 * GiB, None, None) == 10 * GiB
    assert offload.cpu_offload_host_bytes(5 * GiB, None, 3 * GiB) == 6 * GiB  # all it has
    assert offload.cpu_offload_host_bytes(0, None, None) == 0


def test_pipeline_stages_take_the_largest_stage_and_mtp_layers_are_left_out():
    tensors = llama_tensors(5)  # layer 4 stands for an MTP layer past num_hidden_layers
    layers = offload.rank_layer_blocks(tensors, tp_size=1, pp_size=2, num_layers=4)
    assert len(layers) == 2
    assert offload.stage_layers(61, 4) == 16  # 15, 15, 15, 16 (distributed/utils.py)
    assert len(offload.rank_layer_blocks(tensors, tp_size=1, pp_size=1, num_layers=4)) == 4


def test_vision_tower_layers_and_mla_kv_b_proj_stay_out():
    tensors = {
        "vision_tower.encoder.layers.0.mlp.fc1.weight": 10**6,
        "model.layers.0.self_attn.kv_b_proj.weight": 10**6,  # resident (utils/offloader.py)
        "model.layers.0.self_attn.q_a_proj.weight": 300,
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": 200,
    }
    (layer,) = offload.rank_layer_blocks(tensors, tp_size=8, pp_size=1, num_layers=1)
    # MLA's low-rank projections are one replicated parameter.
    assert layer == (Block("self_attn.fused_qkv_a_proj_with_mqa.weight", 500),)


def moe_tensors(layers: int = 4, experts: int = 3) -> dict[str, int]:
    tensors: dict[str, int] = {}
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.gate.weight"] = 4096
        tensors[f"model.layers.{i}.self_attn.o_proj.weight"] = 7 * MiB
        for e in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                tensors[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"] = 1_000_000
            tensors[f"model.layers.{i}.mlp.experts.{e}.down_proj.weight_scale_inv"] = 1000
    return tensors


def test_layer_offload_moves_the_stacked_experts_of_the_last_n_layers_of_each_group():
    layers = offload.rank_layer_blocks(moe_tensors(), tp_size=1, pp_size=1, num_layers=4)
    names = {b.name for b in layers[0] if b.is_expert_weight}
    assert names == {"mlp.experts.gate_up_proj.weight", "mlp.experts.down_proj.weight"}
    # Group 2, 1 in group: layers 1 and 3 (index % 2 >= 2 - 1). w13 = 3 experts x 2 MB = 6 MB
    # -> 8 MiB pinned, w2 = 3 MB -> 4 MiB; the scales and attention stay on the GPU.
    assert offload.offloaded_layers(4, 2, 1) == 2
    assert offload.layer_offload_bytes(layers, 2, 1, pinned=True) == 2 * (8 * MiB + 4 * MiB)
    assert offload.layer_offload_bytes(layers, 2, 1, pinned=False) == 2 * 9_000_000


@pytest.mark.parametrize(
    ("layers", "group", "num", "moved"),
    [(61, 4, 1, 15), (61, 4, 4, 61), (61, 4, 9, 61), (61, 1, 1, 61), (61, -1, 1, 0), (3, 8, 2, 0)],
)
def test_offloaded_layers_follow_the_modulo_rule(layers, group, num, moved):
    assert offload.offloaded_layers(layers, group, num) == moved


def test_the_offload_stops_once_the_moved_bytes_reach_the_limit_exactly():
    layers = ((Block("a", 4 * MiB), Block("b", 3 * MiB)), (Block("c", MiB),))
    assert offload.cpu_offload_pinned_bytes(4 * MiB, layers) == 4 * MiB
    assert offload.cpu_offload_pinned_bytes(4 * MiB + 1, layers) == 8 * MiB  # b: 3 -> 4 MiB
