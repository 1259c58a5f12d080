"""The simulated server's command line, read with argparse the way SGLang's `prepare_server_args`
reads it (`argparse.ArgumentParser`, prefix abbreviation on), written from SGLang 0.5.23's
`ServerArgs` fields. Independent of the supervisor's own argv reader (supervisor/core), so an
error there shows up as a disagreement in the tests.

Flags the simulation does not act on are accepted and ignored (parse_known_args), as long as
the scenario does not list them in `bad_flags`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

PROG = "launch_server.py"

# Other SGLang flags that share a prefix with the ones below: registered so that argparse's
# abbreviation rule sees the same neighbours as SGLang's parser (`--pp` stays ambiguous).
_NEIGHBOURS = (
    "--pp-max-micro-batch-size",
    "--pp-async-batch-depth",
    "--tokenizer-path",
    "--tokenizer-mode",
    "--tokenizer-backend",
    "--moe-dense-tp-size",
    "--nccl-port",
    "--hicache-write-policy",
    "--hicache-storage-backend",
    "--max-running-requests",
    "--max-prefill-tokens",
    "--chunked-prefill-size",
    "--served-model-name",
    "--api-key",
    "--admin-api-key",
)
# Boolean neighbours take no value (a value-taking registration would swallow the next flag).
_SWITCH_NEIGHBOURS = ("--enable-metrics-for-all-schedulers",)


class SimArgsError(ValueError):
    """What SGLang's argparse would print before exiting 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # argparse exits; we raise
        raise SimArgsError(message)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimArgs:
    """The flags the simulation acts on, SGLang's defaults applied."""

    model_path: str
    tp_size: int
    dp_size: int
    pp_size: int
    attn_dp_size: int
    enable_dp_attention: bool
    attn_cp_size: int
    moe_dp_size: int
    ep_size: int
    nnodes: int
    node_rank: int
    dist_init_addr: str | None  # HOST:PORT of the rendezvous (torch's TCPStore master)
    dist_timeout: int | None
    gated_launch_port: int | None
    mem_fraction_static: float | None
    max_total_tokens: int | None
    kv_cache_dtype: str
    page_size: int | None
    chunked_prefill_size: int | None
    enable_hierarchical_cache: bool
    hicache_ratio: float | None
    hicache_size: int
    hicache_host_memory_mode: str
    hicache_mem_layout: str
    hicache_io_backend: str
    tokenizer_worker_num: int
    detokenizer_worker_num: int
    skip_tokenizer_init: bool
    host: str
    port: int
    base_gpu_id: int
    gpu_id_step: int
    api_key: str | None
    enable_metrics: bool
    skip_server_warmup: bool
    served_model_name: str | None
    # A hybrid model's pools (supervisor/testing/hybrid.py); None: SGLang's fallback.
    swa_full_tokens_ratio: float | None = None
    disable_hybrid_swa_memory: bool = False
    mamba_full_memory_ratio: float | None = None
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: str | None = None


def _parser() -> _Parser:
    p = _Parser(prog=PROG, add_help=False)
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    p.add_argument(
        "--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int
    )
    # Deprecated in 0.5.23 (server_args.py DeprecatedStoreTrueAction); resolution turns
    # `--dp-size N --enable-dp-attention` into `--attn-dp-size N` (parallel_hook.py).
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument(
        "--attn-cp-size", "--attention-context-parallel-size", dest="attn_cp_size", type=int
    )
    p.add_argument("--moe-dp-size", "--moe-data-parallel-size", dest="moe_dp_size", type=int)
    p.add_argument("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr")
    p.add_argument("--dist-timeout", type=int)
    p.add_argument("--gated-launch-port", type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--page-size", type=int)
    p.add_argument(
        "--enable-hierarchical-cache", "--enable-hicache", dest="hicache", action="store_true"
    )
    p.add_argument("--hicache-ratio", type=float)
    p.add_argument("--hicache-size", type=int, default=0)
    p.add_argument("--hicache-host-memory-mode", choices=("cache", "buffer_only"), default="cache")
    p.add_argument(
        "--hicache-mem-layout",
        choices=(
            "layer_first",
            "page_first",
            "page_first_direct",
            "page_first_kv_split",
            "page_head",
        ),
        default="page_first",
    )
    p.add_argument(
        "--hicache-io-backend", choices=("direct", "kernel", "kernel_ascend"), default="kernel"
    )
    p.add_argument("--tokenizer-worker-num", type=int, default=1)
    p.add_argument("--detokenizer-worker-num", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--gpu-id-step", type=int, default=1)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    _add_hybrid_flags(p)
    return p


def _add_hybrid_flags(p: _Parser) -> None:
    """The flags that size a hybrid model's pools (arg_groups/fields/schedule.py, exec_.py),
    then the neighbours that keep SGLang's abbreviations ambiguous where they are."""
    p.add_argument("--swa-full-tokens-ratio", type=float)
    p.add_argument("--disable-hybrid-swa-memory", action="store_true")
    p.add_argument("--mamba-full-memory-ratio", type=float)
    p.add_argument("--max-mamba-cache-size", type=int)
    p.add_argument("--mamba-ssm-dtype", choices=("float32", "bfloat16", "float16"))
    for flag in _NEIGHBOURS:
        p.add_argument(flag, dest=flag[2:].replace("-", "_"))
    for flag in _SWITCH_NEIGHBOURS:
        p.add_argument(flag, action="store_true")


def parse_sim_args(argv: Sequence[str]) -> SimArgs:
    """SGLang's reading of `argv`; unknown flags are ignored.

    Raises:
        SimArgsError: what argparse rejects (a missing --model-path, an ambiguous abbreviation,
            a value of the wrong type).
    """
    ns, _unknown = _parser().parse_known_args(list(argv))
    chunked = ns.chunked_prefill_size
    return SimArgs(
        model_path=ns.model_path,
        tp_size=ns.tp_size,
        dp_size=ns.dp_size,
        pp_size=ns.pp_size,
        attn_dp_size=ns.attn_dp_size or 1,
        enable_dp_attention=ns.enable_dp_attention,
        attn_cp_size=ns.attn_cp_size or 1,
        moe_dp_size=ns.moe_dp_size or 1,
        ep_size=ns.ep_size or 1,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        dist_timeout=ns.dist_timeout,
        gated_launch_port=ns.gated_launch_port,
        mem_fraction_static=ns.mem_fraction_static,
        max_total_tokens=ns.max_total_tokens,
        kv_cache_dtype=ns.kv_cache_dtype,
        page_size=ns.page_size,
        chunked_prefill_size=int(chunked) if chunked is not None else None,
        enable_hierarchical_cache=ns.hicache,
        hicache_ratio=ns.hicache_ratio,
        hicache_size=ns.hicache_size,
        hicache_host_memory_mode=ns.hicache_host_memory_mode,
        hicache_mem_layout=ns.hicache_mem_layout,
        hicache_io_backend=ns.hicache_io_backend,
        tokenizer_worker_num=ns.tokenizer_worker_num,
        detokenizer_worker_num=ns.detokenizer_worker_num,
        skip_tokenizer_init=ns.skip_tokenizer_init,
        host=ns.host,
        port=ns.port,
        base_gpu_id=ns.base_gpu_id,
        gpu_id_step=ns.gpu_id_step,
        api_key=ns.api_key,
        enable_metrics=ns.enable_metrics,
        skip_server_warmup=ns.skip_server_warmup,
        served_model_name=ns.served_model_name,
        swa_full_tokens_ratio=ns.swa_full_tokens_ratio,
        disable_hybrid_swa_memory=ns.disable_hybrid_swa_memory,
        mamba_full_memory_ratio=ns.mamba_full_memory_ratio,
        max_mamba_cache_size=ns.max_mamba_cache_size,
        mamba_ssm_dtype=ns.mamba_ssm_dtype,
    )
