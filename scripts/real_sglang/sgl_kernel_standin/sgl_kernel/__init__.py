"""A stand-in for sgl-kernel's CPU names, for SGLang 0.5.23 on a CPU-only test machine.

Not SGLang's code, and the one piece of the real-SGLang test lane that is not SGLang's (see
docs/real-sglang.md). With SGLANG_USE_CPU_ENGINE=1, SGLang imports a few `*_cpu` functions from
`sgl_kernel` when its modules load (sglang/srt/mem_cache/allocation.py,
sglang/kernels/ops/kvcache/cache_move.py, sglang/kernels/ops/speculative/*.py). The PyPI wheels
of sgl-kernel are CUDA builds only, so this package provides those names and nothing else.

It registers no `torch.ops.sgl_kernel` operator: SGLang's `_is_intel_amx_backend_available()`
(sglang/srt/utils/common.py) looks for `torch.ops.sgl_kernel.convert_weight_packed`, so
`cpu_has_amx_support()` stays false and every CustomOp layer takes SGLang's own
`forward_native` path. Plain serving calls only `assign_req_to_token_pool_cpu`, implemented
here in torch; every other name raises NotImplementedError naming itself.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

__version__ = "0.0.0+standin"
STANDIN = True  # the lane's build checks that SGLang imported this package, not a wheel


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Row `req_pool_indices[i]` of `req_to_token`, columns [start_offset[i], end_offset[i]),
    gets the i-th run of `out_cache_loc` (the runs lie end to end, in request order): what the
    triton `assign_req_to_token_pool` in sglang/srt/mem_cache/allocation.py does."""
    del pool_len  # the row length; torch indexing knows it
    taken = 0
    rows = req_pool_indices.tolist()
    for i, (start, end) in enumerate(zip(start_offset.tolist(), end_offset.tolist(), strict=True)):
        row = rows[i]
        length = end - start
        if length <= 0:
            continue
        req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length


def _missing(name: str) -> Any:
    def call(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by the real-SGLang lane's stand-in "
            "(scripts/real_sglang/sgl_kernel_standin): only plain serving is supported"
        )

    call.__name__ = name
    call.__qualname__ = name
    return call


# Imported by SGLang's modules on CPU, called only by the KV-cache copy (HiCache host moves)
# and by speculative decoding, neither of which the lane runs.
copy_all_layer_kv_cache_cpu = _missing("copy_all_layer_kv_cache_cpu")
rotate_input_ids_cpu = _missing("rotate_input_ids_cpu")
fill_accept_out_cache_loc_cpu = _missing("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _missing("fill_bonus_tokens_cpu")
assign_draft_cache_locs_contiguous_cpu = _missing("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _missing("assign_extend_cache_locs_cpu")
build_tree_kernel_efficient_cpu = _missing("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _missing("verify_tree_greedy_cpu")
build_draft_decode_metadata_cpu = _missing("build_draft_decode_metadata_cpu")
