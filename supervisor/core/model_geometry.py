"""KV-cache geometry: a model's config.json keys + the launch plan -> bytes per token per rank.

Pure arithmetic over the language model's config dict (text_config already merged by the adapter).
Formulas from SGLang's host pools (docs/sglang.md §1.2, §7); device and host cells are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.core.bounded import shown
from supervisor.core.sglang_args import LaunchPlan


class GeometryError(ValueError):
    """The model config lacks a key the KV arithmetic needs, or holds a value of the wrong kind."""


# Bits per stored element, counted in 1/32 bit so that block-scaled formats stay exact in
# integers (fractions costs ~1.4 ms of the pre-flight's import). Block-scaled formats carry one
# 8-bit scale per block: mxfp8 = 8 + 8/32, nvfp4 = 4 + 8/16, fp4_mx_block16 = 4 + 8/16 (SGLang's
# MXFP8/FP4 pools).
_SUB = 32  # parts of a bit
_SUBBITS_PER_ELEMENT: dict[str, int] = {
    "float32": 32 * _SUB,
    "fp32": 32 * _SUB,
    "float": 32 * _SUB,
    "bfloat16": 16 * _SUB,
    "bf16": 16 * _SUB,
    "float16": 16 * _SUB,
    "fp16": 16 * _SUB,
    "half": 16 * _SUB,
    "fp8_e4m3": 8 * _SUB,
    "fp8_e5m2": 8 * _SUB,
    "fp8": 8 * _SUB,
    "mxfp8": 8 * _SUB + 8 * _SUB // 32,
    "nvfp4": 4 * _SUB + 8 * _SUB // 16,
    "fp4_mx_block16": 4 * _SUB + 8 * _SUB // 16,
}

# Speculative algorithms whose draft runs the checkpoint's own MTP (NextN) layers; their KV is
# packed into the target's pools as extra layers (docs/sglang.md §1.2).
_MTP_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "MTP"})

# DeepSeek sparse attention (DSA) stores the MLA row in an fp8 scaled layout of 656 bytes:
# 512 fp8 latent + 512/128 * 4 scale bytes + 64 rope dims in bf16 (docs/sglang.md §1.2).
_DSA_FP8_ROW_BYTES = 512 + 512 // 128 * 4 + 64 * 2


# The integer keys the arithmetic reads: (keys, least value, most value). Most is far beyond any
# released model (126 layers, 16,384 hidden, 128 heads); past it a value is a damaged file, and
# 0 heads or 0 KV heads plan a model that SGLang cannot build.
_SHAPE_KEYS: tuple[tuple[tuple[str, ...], int, int], ...] = (
    (("num_hidden_layers", "num_layers", "n_layer"), 1, 10_000),
    (("num_attention_heads", "n_head"), 1, 65_536),
    (("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), 1, 65_536),
    (("hidden_size", "n_embd", "head_dim", "v_head_dim"), 1, 1 << 20),
    (("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"), 1, 1 << 20),
    (("q_lora_rank",), 0, 1 << 20),
    (("n_routed_experts", "first_k_dense_replace", "num_nextn_predict_layers"), 0, 65_536),
)


def shape_problem(config: Mapping[str, Any]) -> str | None:
    """The first integer key of the model's shape that is not an integer in its range (the
    key named), or None. Checked for every key present, used by this plan or not: a value the
    arithmetic skips today (0 KV heads read as "absent") must not plan a model that fits."""
    for keys, least, most in _SHAPE_KEYS:
        for key in keys:
            value = config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                return f"config key {key} must be an integer, got {shown(value)}"
            if not least <= value <= most:
                return f"config key {key} must be {least} to {most:,} (got {shown(value)})"
    return None


def _get_int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GeometryError(f"config key {key} must be a non-negative integer, got {value!r}")
        return value
    return None


def _require_int(config: Mapping[str, Any], *keys: str) -> int:
    value = _get_int(config, *keys)
    if value is None:
        raise GeometryError(f"config lacks {' / '.join(keys)}")
    return value


def _model_dtype(config: Mapping[str, Any]) -> str:
    raw = config.get("torch_dtype", config.get("dtype", "bfloat16"))
    return str(raw).removeprefix("torch.").lower()


def _kv_cache_quant_algo(config: Mapping[str, Any]) -> object:
    """The checkpoint's `kv_cache_quant_algo` (in quantization_config or its ModelOpt
    `quantization` section), None when it has none."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    algo = quant.get("kv_cache_quant_algo")
    if algo is None and isinstance(quant.get("quantization"), Mapping):
        algo = quant["quantization"].get("kv_cache_quant_algo")
    return algo


def checkpoint_declares_fp8_kv(config: Mapping[str, Any]) -> bool:
    """True when the checkpoint says its KV cache is FP8: `kv_cache_quant_algo` is "FP8" in any
    case, exactly as SGLang compares it (mem_cache/kv_cache_dtype.py `configure_kv_cache_dtype`,
    the same in 0.5.18 to 0.5.23); "FP8_E5M2" or "NVFP4" are not, and leave the model dtype."""
    algo = _kv_cache_quant_algo(config)
    return isinstance(algo, str) and algo.upper() == "FP8"


def kv_quant_note(config: Mapping[str, Any], plan: LaunchPlan) -> str | None:
    """A warning when the checkpoint names a KV quantization SGLang ignores under
    `--kv-cache-dtype auto`: it then keeps the model dtype (twice or four times the bytes the
    name suggests), and says nothing. None when there is nothing to say."""
    algo = _kv_cache_quant_algo(config)
    if plan.kv_cache_dtype != "auto" or algo is None or checkpoint_declares_fp8_kv(config):
        return None
    return (
        f"quantization_config.kv_cache_quant_algo = {shown(algo)} is not FP8, the only value "
        f"SGLang acts on: with --kv-cache-dtype auto the KV cache stays {_model_dtype(config)} "
        "(planned so); give --kv-cache-dtype to choose another"
    )


def kv_cache_dtype(config: Mapping[str, Any], plan: LaunchPlan) -> str:
    """The KV dtype SGLang will use: `auto` is the model dtype unless the checkpoint says FP8."""
    if plan.kv_cache_dtype != "auto":
        return plan.kv_cache_dtype
    if checkpoint_declares_fp8_kv(config):
        return "fp8_e4m3"
    return _model_dtype(config)


def _subbits(dtype: str) -> int:
    """Bits per element of `dtype`, in 1/32 bit."""
    bits = _SUBBITS_PER_ELEMENT.get(dtype)
    if bits is None:
        raise GeometryError(f"unknown KV dtype {dtype!r} (torch_dtype or --kv-cache-dtype)")
    return bits


def is_mla(config: Mapping[str, Any]) -> bool:
    """Multi-head latent attention (DeepSeek-V3/R1, Kimi-K2): one compressed row per layer."""
    return config.get("kv_lora_rank") is not None


def is_dsa(config: Mapping[str, Any]) -> bool:
    """DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): MLA plus a lightning-indexer cache."""
    return is_mla(config) and config.get("index_head_dim") is not None


def uses_mtp_layers(config: Mapping[str, Any], plan: LaunchPlan) -> bool:
    """Speculative decoding drafts with the checkpoint's own MTP layers, not a draft model."""
    algo = (plan.speculative_algorithm or "").upper()
    if algo not in _MTP_ALGORITHMS:
        return False
    draft = plan.speculative_draft_model_path
    if draft is not None and draft != plan.model_path:
        return False
    return (_get_int(config, "num_nextn_predict_layers") or 0) > 0


def layers_per_rank(config: Mapping[str, Any], plan: LaunchPlan) -> int:
    """KV layers one rank holds: its pipeline stage (the largest one) plus packed MTP layers."""
    total = _require_int(config, "num_hidden_layers", "num_layers", "n_layer")
    stage = -(-total // plan.pp_size)
    if uses_mtp_layers(config, plan):
        stage += _get_int(config, "num_nextn_predict_layers") or 0
    return stage


def kv_heads_per_rank(config: Mapping[str, Any], plan: LaunchPlan) -> int:
    """KV heads on one attention-TP rank; replicated when TP exceeds the KV heads."""
    heads = _require_int(config, "num_attention_heads", "n_head")
    kv_heads = _get_int(config, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    return max(1, (kv_heads or heads) // plan.attention_tp_size)


def tp_split_problem(config: Mapping[str, Any], plan: LaunchPlan) -> str | None:
    """Why SGLang cannot split this model's attention over the launch's TP, or None.

    SGLang 0.5.23 asserts it while building the layers, after the processes have started and
    the load has begun (srt/layers/linear.py `QKVParallelLinear`: `divide(total_num_heads,
    tp_size)`, then `divide(tp_size, total_num_kv_heads)` when TP reaches the KV heads, else
    `divide(total_num_kv_heads, tp_size)`; srt/models/llama.py `LlamaAttention` asserts the same;
    MLA models only the heads, srt/models/deepseek_v2.py `num_heads % attn_tp_size`). With DP
    attention the heads are split over the attention TP only. A config without heads is left
    to the KV arithmetic, which names the missing key.
    """
    heads = _get_int(config, "num_attention_heads", "n_head")
    if not heads:
        return None
    tp = plan.attention_tp_size
    flag = f"--tp-size {plan.tp_size}" + (f" (attention TP {tp})" if tp != plan.tp_size else "")
    if heads % tp:
        return f"{flag} does not divide the {heads} attention heads"
    if is_mla(config):
        return None
    kv_heads = _get_int(config, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    kv_heads = kv_heads or heads
    if tp >= kv_heads and tp % kv_heads:
        return f"{flag} is not a multiple of the {kv_heads} KV heads"
    if tp < kv_heads and kv_heads % tp:
        return f"{flag} does not divide the {kv_heads} KV heads"
    return None


def _row_subbits(config: Mapping[str, Any], plan: LaunchPlan) -> int:
    """Bits of one token's KV in one layer on one rank, in 1/32 bit."""
    dtype = kv_cache_dtype(config, plan)
    bits = _subbits(dtype)
    if is_mla(config):
        if is_dsa(config) and bits == 8 * _SUB:
            return _DSA_FP8_ROW_BYTES * 8 * _SUB
        kv_lora_rank = _require_int(config, "kv_lora_rank")
        rope = _require_int(config, "qk_rope_head_dim")
        return (kv_lora_rank + rope) * bits
    heads = _require_int(config, "num_attention_heads", "n_head")
    head_dim = _get_int(config, "head_dim")
    if head_dim is None:
        hidden = _require_int(config, "hidden_size", "n_embd")
        if heads == 0:
            raise GeometryError("config key num_attention_heads must be positive")
        head_dim = hidden // heads
    v_head_dim = _get_int(config, "v_head_dim") or head_dim
    return (head_dim + v_head_dim) * kv_heads_per_rank(config, plan) * bits


def bytes_per_token_per_rank(config: Mapping[str, Any], plan: LaunchPlan) -> int:
    """Bytes one token occupies in one rank's KV pool (device and host rows are the same size).

    MHA/GQA: (head_dim + v_head_dim) · kv_heads_per_rank · layers · itemsize.
    MLA: (kv_lora_rank + qk_rope_head_dim) · layers · itemsize, replicated on every rank.
    Layers include packed MTP draft layers when speculative decoding uses them.

    Raises:
        GeometryError: the config lacks a key the formula needs (the message names it).
    """
    total_subbits = _row_subbits(config, plan) * layers_per_rank(config, plan)
    if total_subbits <= 0:
        raise GeometryError(
            "config gives 0 bytes of KV cache per token: num_hidden_layers, head_dim / "
            "hidden_size (MLA: kv_lora_rank + qk_rope_head_dim) must be positive"
        )
    return -(-total_subbits // (8 * _SUB))


def indexer_bytes_per_token_per_rank(config: Mapping[str, Any], plan: LaunchPlan) -> int:
    """Extra bytes per token of the DSA indexer pool (0 for models without DSA).

    (index_head_dim + index_head_dim/128 · 4 scale bytes) · 1 byte · layers: 132 B/layer for
    DeepSeek-V3.2. SGLang allocates it outside the `--hicache-size` budget (docs/sglang.md §1.2).
    """
    if not is_dsa(config):
        return 0
    index_head_dim = _require_int(config, "index_head_dim")
    row = index_head_dim + index_head_dim // 128 * 4
    return row * layers_per_rank(config, plan)


def attention_kind(config: Mapping[str, Any]) -> str:
    """ "dsa", "mla" or "mha" (GQA included), for reports."""
    if is_dsa(config):
        return "dsa"
    if is_mla(config):
        return "mla"
    return "mha"


def kv_row_bytes(config: Mapping[str, Any], plan: LaunchPlan, layers: int) -> int:
    """Bytes one token takes in `layers` attention layers of one rank: the row of a pool that
    holds only some of the layers (a hybrid model's full and sliding-window pools)."""
    return -(-_row_subbits(config, plan) * max(0, layers) // (8 * _SUB))
