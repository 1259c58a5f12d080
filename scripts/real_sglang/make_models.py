"""Tiny random-weight models for the real-SGLang lane, made here from a fixed seed.

    <lane venv>/bin/python scripts/real_sglang/make_models.py OUT_DIR

Writes OUT_DIR/llama-gqa (LlamaForCausalLM: hidden 128, intermediate 256, 2 layers, 4 heads
and 2 KV heads of 32, so TP 2 splits both; vocab 512; bf16; one safetensors file) and
OUT_DIR/deepseek-v2-mla (DeepseekV2ForCausalLM, MLA attention, dense MLP only), each with a
byte-level BPE tokenizer trained here with `tokenizers` on a few sentences and a one-line chat
template. The same seed gives the same files: the lane's stamp covers this script. Runs in the
lane's venv (torch, safetensors, tokenizers); nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SEED = 20260523
VOCAB = 512
SPECIALS = ["<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
SENTENCES = [
    "The supervisor starts the server, watches every rank and stops it cleanly.",
    "A tiny model with random weights answers every request with tokens of its own.",
    "Host memory, device memory and the KV cache are measured before the launch.",
    "When a rank dies the whole tree is killed and the server is started again.",
    "Draining requests and shutting down: the requests in flight complete first.",
    "The quick brown fox jumps over the lazy dog, again and again, on two cores.",
    "Prefill batch, decode batch, new tokens, cached tokens, running requests.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and words: alpha beta gamma delta epsilon zeta.",
]


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE with exactly VOCAB entries (padded with reserved tokens when the few
    sentences give fewer merges), so every id the model can emit decodes."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(SENTENCES * 4, trainer=trainer)
    missing = VOCAB - tokenizer.get_vocab_size()
    if missing > 0:
        tokenizer.add_special_tokens([f"<reserved_{i}>" for i in range(missing)])
    assert tokenizer.get_vocab_size() == VOCAB, tokenizer.get_vocab_size()
    return tokenizer


def write_tokenizer(out: Path, tokenizer: Tokenizer) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[0],
        "eos_token": SPECIALS[1],
        "model_max_length": 16384,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    specials = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1]}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=1) + "\n")


def _normal(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)


def _ones(size: int) -> torch.Tensor:
    return torch.ones(size, dtype=torch.bfloat16)


COMMON = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": VOCAB,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
}


def llama_gqa() -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    config = {
        **COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_key_value_heads": 2,
        "head_dim": 32,
    }
    g = torch.Generator().manual_seed(SEED)
    h, i, heads, kv = 128, 256, 4, 2
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _normal(g, VOCAB, h)}
    for n in range(2):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = _ones(h)
        w[p + "post_attention_layernorm.weight"] = _ones(h)
        w[p + "self_attn.q_proj.weight"] = _normal(g, heads * 32, h)
        w[p + "self_attn.k_proj.weight"] = _normal(g, kv * 32, h)
        w[p + "self_attn.v_proj.weight"] = _normal(g, kv * 32, h)
        w[p + "self_attn.o_proj.weight"] = _normal(g, h, heads * 32)
        w.update(_mlp(g, p, h, i))
    w["model.norm.weight"] = _ones(h)
    w["lm_head.weight"] = _normal(g, VOCAB, h)
    return config, w


def _mlp(g: torch.Generator, prefix: str, hidden: int, inter: int) -> dict[str, torch.Tensor]:
    return {
        prefix + "mlp.gate_proj.weight": _normal(g, inter, hidden),
        prefix + "mlp.up_proj.weight": _normal(g, inter, hidden),
        prefix + "mlp.down_proj.weight": _normal(g, hidden, inter),
    }


def deepseek_v2_mla() -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """MLA without a q LoRA and without experts (first_k_dense_replace = every layer)."""
    lora, nope, rope, v = 64, 32, 16, 32
    config = {
        **COMMON,
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "num_key_value_heads": 4,
        "q_lora_rank": None,
        "kv_lora_rank": lora,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v,
        # Experts are declared (transformers' config wants integers) but never built: every
        # layer is below first_k_dense_replace, so each has a dense MLP.
        "n_routed_experts": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 2,
        "moe_layer_freq": 1,
        "moe_intermediate_size": 256,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "greedy",
        # SGLang's CPU RoPE for MLA is DeepSeek's YaRN only (get_rope_cpu asserts it); factor
        # 1 leaves the positions as they are.
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 1.0,
            "original_max_position_embeddings": 16384,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    }
    g = torch.Generator().manual_seed(SEED + 1)
    h, heads = 128, 4
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _normal(g, VOCAB, h)}
    for n in range(2):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = _ones(h)
        w[p + "post_attention_layernorm.weight"] = _ones(h)
        w[p + "self_attn.q_proj.weight"] = _normal(g, heads * (nope + rope), h)
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = _normal(g, lora + rope, h)
        w[p + "self_attn.kv_a_layernorm.weight"] = _ones(lora)
        w[p + "self_attn.kv_b_proj.weight"] = _normal(g, heads * (nope + v), lora)
        w[p + "self_attn.o_proj.weight"] = _normal(g, h, heads * v)
        w.update(_mlp(g, p, h, 256))
    w["model.norm.weight"] = _ones(h)
    w["lm_head.weight"] = _normal(g, VOCAB, h)
    return config, w


def write_model(out: Path, config: dict[str, object], weights: dict[str, torch.Tensor]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    generation = {"bos_token_id": 0, "eos_token_id": 1}
    (out / "generation_config.json").write_text(json.dumps(generation) + "\n")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(out, train_tokenizer())


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: make_models.py OUT_DIR", file=sys.stderr)
        return 2
    root = Path(sys.argv[1])
    write_model(root / "llama-gqa", *llama_gqa())
    write_model(root / "deepseek-v2-mla", *deepseek_v2_mla())
    print(f"make_models: wrote {root}/llama-gqa and {root}/deepseek-v2-mla")
    return 0


if __name__ == "__main__":
    sys.exit(main())
