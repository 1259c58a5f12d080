"""The launch_server argv is read the way SGLang's argparse reads it, and never rewritten."""

from __future__ import annotations

import pytest

from supervisor.core.sglang_args import (
    ArgvError,
    parse_launch_args,
    redact_argv,
    with_flag_value,
)

SEED = ["--model-path", "/models/kimi", "--tp-size", "8", "--enable-hierarchical-cache"]


def test_defaults_match_sglang() -> None:
    plan = parse_launch_args(["--model-path", "/m"])
    assert (plan.tp_size, plan.dp_size, plan.pp_size, plan.nnodes) == (1, 1, 1, 1)
    assert (plan.host, plan.port) == ("127.0.0.1", 30000)
    assert plan.hicache_size_gb == 0
    assert plan.kv_cache_dtype == "auto"
    assert plan.effective_page_size == 1
    assert plan.hicache_mode == "auto"


@pytest.mark.parametrize(
    "argv",
    [
        ["--tp-size", "8"],
        ["--tp", "8"],
        ["--tensor-parallel-size", "8"],
        ["--tp-size=8"],
        ["--tp=8"],
    ],
)
def test_tp_spellings_and_unique_prefixes(argv: list[str]) -> None:
    assert parse_launch_args(argv).tp_size == 8


def test_ambiguous_prefix_is_refused_like_argparse() -> None:
    with pytest.raises(ArgvError, match="ambiguous option: --pp could match"):
        parse_launch_args(["--pp", "2"])


def test_underscore_spelling_is_refused_with_the_right_spelling() -> None:
    with pytest.raises(ArgvError, match="SGLang spells it --tp-size"):
        parse_launch_args(["--tp_size", "8"])


def test_model_alias_and_ep_alias() -> None:
    plan = parse_launch_args(["--model", "/m", "--ep", "8"])
    assert plan.model_path == "/m"
    assert plan.ep_size == 8


def test_dp_replicas_count_as_local_ranks_but_dp_attention_does_not() -> None:
    assert parse_launch_args(["--tp", "4", "--dp-size", "2"]).local_ranks == 8
    dp_attn = parse_launch_args(["--tp", "8", "--dp-size", "8", "--enable-dp-attention"])
    assert dp_attn.local_ranks == 8
    assert dp_attn.attention_tp_size == 1


def test_multi_node_divides_ranks() -> None:
    plan = parse_launch_args(["--tp", "16", "--nnodes", "2", "--node-rank", "1"])
    assert plan.local_ranks == 8


def test_gpu_ids_follow_base_and_step() -> None:
    plan = parse_launch_args(["--tp", "2", "--base-gpu-id", "4", "--gpu-id-step", "2"])
    assert plan.local_gpu_ids() == (4, 6)


def test_hicache_modes() -> None:
    assert parse_launch_args([*SEED, "--hicache-size", "48"]).hicache_mode == "size"
    assert parse_launch_args([*SEED, "--hicache-ratio", "2"]).hicache_mode == "ratio"
    both = parse_launch_args([*SEED, "--hicache-ratio", "2", "--hicache-size", "10"])
    assert both.hicache_mode == "size"  # SGLang: size wins over ratio


def test_enable_hicache_alias() -> None:
    assert parse_launch_args(["--enable-hicache"]).enable_hierarchical_cache


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hicache-size", "-5"], "--hicache-size '-5': must not be negative"),
        (["--hicache-size", "4.5"], "--hicache-size '4.5'"),
        (["--tp", "0"], "--tp '0'"),
        (["--port", "70000"], "--port '70000'"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static '1.5'"),
        (["--kv-cache-dtype", "fp7"], "must be one of"),
        (["--tp-size"], "--tp-size expects a value"),
        (["--enable-hicache=1"], "takes no value"),
        (["--tp", "8", "--tensor-parallel-size", "4"], "contradicting flags: --tp 8"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 needs --nnodes above it"),
        (["--tp", "3", "--nnodes", "2"], "does not divide over --nnodes 2"),
    ],
)
def test_bad_values_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ArgvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_launch_args(argv)


def test_repeating_a_flag_with_the_same_value_is_fine() -> None:
    assert parse_launch_args(["--tp", "8", "--tp-size", "8"]).tp_size == 8


def test_unknown_flags_pass_through_untouched() -> None:
    argv = ["--trust-remote-code", "--model-path", "/m", "--some-new-flag", "x", "--tp", "2"]
    plan = parse_launch_args(argv)
    assert plan.argv == tuple(argv)
    assert plan.tp_size == 2


def test_with_flag_value_replaces_in_place_in_every_spelling() -> None:
    argv = [*SEED, "--hicache-size", "300", "--page-size", "64"]
    out = with_flag_value(argv, "--hicache-size", "48")
    assert out == (*SEED, "--hicache-size", "48", "--page-size", "64")
    eq = with_flag_value([*SEED, "--hicache-size=300"], "--hicache-size", "48")
    assert eq == (*SEED, "--hicache-size=48")


def test_with_flag_value_appends_when_absent() -> None:
    assert with_flag_value(SEED, "--hicache-size", "48") == (*SEED, "--hicache-size", "48")


def test_redact_argv_hides_api_keys_in_both_forms() -> None:
    argv = ["--api-key", "sk-secret", "--admin-api-key=adm-secret", "--tp", "2"]
    out = redact_argv(argv)
    assert "sk-secret" not in " ".join(out)
    assert "adm-secret" not in " ".join(out)
    assert out == ("--api-key", "***", "--admin-api-key=***", "--tp", "2")


def test_gpu_ids_with_pipeline_stages_follow_sglangs_formula() -> None:
    """base + pp_rank × tp_per_node + tp_rank × gpu_id_step (docs/sglang.md §3), step on TP only."""
    assert parse_launch_args(
        ["--tp", "2", "--pp-size", "2", "--base-gpu-id", "4"]
    ).local_gpu_ids() == (
        4,
        5,
        6,
        7,
    )
    stepped = parse_launch_args(["--tp", "2", "--pp-size", "2", "--gpu-id-step", "2"])
    assert stepped.local_gpu_ids() == (0, 2, 2, 4)
