"""The launch_server argv is read the way SGLang's argparse reads it, and never rewritten."""

from __future__ import annotations

import pytest

from supervisor.core import sglang_cli_data
from supervisor.core.secret_names import is_secret_name
from supervisor.core.sglang_args import (
    ArgvError,
    LaunchPlan,
    parse_launch_args,
    redact_argv,
    secret_flag_names,
    with_flag_value,
)
from supervisor.core.sglang_flags import is_secret_flag
from supervisor.core.sglang_versions import rules_for_version, table_for

SEED = ["--model-path", "/models/kimi", "--tp-size", "8", "--enable-hierarchical-cache"]
STRICT = rules_for_version("0.5.23").cli()  # as `run` and `preflight` read a 0.5.23 argv


def parse(*args: str) -> LaunchPlan:
    return parse_launch_args(["--model-path", "/m", *args], STRICT)


def test_defaults_match_sglang() -> None:
    plan = parse()
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
    assert parse(*argv).tp_size == 8


@pytest.mark.parametrize("prefix", ["--pp", "--enable-hi", "--kv", "--page"])
def test_ambiguous_prefixes_are_refused_like_argparse(prefix: str) -> None:
    with pytest.raises(ArgvError, match=f"ambiguous option: {prefix} could match"):
        parse(prefix, "2")


def test_prefixes_sglang_accepts_are_accepted() -> None:
    """--ho and --po are unique in 0.5.23 (no --host-port, no --port-range there)."""
    plan = parse("--ho", "0.0.0.0", "--po", "31000")
    assert (plan.host, plan.port) == ("0.0.0.0", 31000)


def test_underscore_spelling_is_refused_with_the_right_spelling() -> None:
    hint = r"unrecognized arguments: --tp_size 8 \(SGLang spells --tp_size as --tp-size\)"
    with pytest.raises(ArgvError, match=hint):
        parse("--tp_size", "8")


@pytest.mark.parametrize("flag", ["--torchao-config", "--host-port", "--some-new-flag"])
def test_flags_the_release_lacks_are_refused_in_sglang_s_words(flag: str) -> None:
    with pytest.raises(ArgvError, match=f"unrecognized arguments: {flag} x"):
        parse(flag, "x")


def test_an_invalid_choice_is_refused_in_sglang_s_words() -> None:
    with pytest.raises(ArgvError, match="argument --hicache-storage-backend: invalid choice"):
        parse("--hicache-storage-backend", "bogus")


def test_a_missing_model_path_is_refused_in_sglang_s_words() -> None:
    with pytest.raises(ArgvError, match="required: --model-path/--model"):
        parse_launch_args(["--tp", "2"], STRICT)


def test_model_alias_and_ep_alias() -> None:
    plan = parse_launch_args(["--model", "/m", "--ep", "8"], STRICT)
    assert plan.model_path == "/m"
    assert plan.ep_size == 8


def test_dp_replicas_count_as_local_ranks_but_dp_attention_does_not() -> None:
    assert parse("--tp", "4", "--dp-size", "2").local_ranks == 8
    dp_attn = parse("--tp", "8", "--dp-size", "8", "--enable-dp-attention")
    assert dp_attn.local_ranks == 8
    assert dp_attn.attention_tp_size == 1


def test_multi_node_divides_ranks() -> None:
    plan = parse("--tp", "16", "--nnodes", "2", "--node-rank", "1")
    assert plan.local_ranks == 8


def test_a_server_on_cpu_claims_no_gpu() -> None:
    plan = parse("--tp", "2", "--device", "cpu")
    assert plan.on_cpu
    assert plan.local_gpu_ids() == ()
    assert plan.local_ranks == 2
    assert not parse("--device", "cuda").on_cpu
    assert parse().local_gpu_ids() == (0,)  # no --device: SGLang detects it, a GPU here


def test_gpu_ids_follow_base_and_step() -> None:
    plan = parse("--tp", "2", "--base-gpu-id", "4", "--gpu-id-step", "2")
    assert plan.local_gpu_ids() == (4, 6)


def test_hicache_modes() -> None:
    assert parse(*SEED, "--hicache-size", "48").hicache_mode == "size"
    assert parse(*SEED, "--hicache-ratio", "2").hicache_mode == "ratio"
    both = parse(*SEED, "--hicache-ratio", "2", "--hicache-size", "10")
    assert both.hicache_mode == "size"  # SGLang: size wins over ratio


def test_enable_hicache_alias() -> None:
    assert parse("--enable-hicache").enable_hierarchical_cache


def test_numa_node_is_a_list_of_ints_indexed_by_gpu() -> None:
    assert parse("--numa-node", "0", "0", "1", "1").numa_node == (0, 0, 1, 1)
    with pytest.raises(ArgvError, match="invalid int value"):
        parse("--numa-node", "zero")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hicache-size", "-5"], "--hicache-size -5: must not be negative"),
        (["--hicache-size", "4.5"], "argument --hicache-size: invalid int value: '4.5'"),
        (["--tp", "0"], "--tp-size 0: must be at least 1"),
        (["--port", "70000"], "--port 70000: must be a TCP port"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static 1.5: must be in (0, 1]"),
        (["--mem-fraction-static", "nan"], "--mem-fraction-static nan: must be in (0, 1]"),
        (["--hicache-ratio", "NaN"], "--hicache-ratio nan: must be a finite positive number"),
        (["--hicache-ratio", "inf"], "--hicache-ratio inf: must be a finite positive number"),
        (["--hicache-ratio=-inf"], "--hicache-ratio -inf: must be a finite positive number"),
        (["--hicache-ratio", "-1"], "--hicache-ratio -1.0: must be a finite positive number"),
        (["--hicache-ratio", "0"], "--hicache-ratio 0.0: must be a finite positive number"),
        (["--kv-cache-dtype", "fp7"], "argument --kv-cache-dtype: invalid choice: 'fp7'"),
        (["--tp-size"], "argument --tp-size/--tensor-parallel-size: expected one argument"),
        (["--enable-hicache=1"], "ignored explicit argument '1'"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 needs --nnodes above it"),
        (["--tp", "3", "--nnodes", "2"], "does not divide over --nnodes 2"),
    ],
)
def test_bad_values_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ArgvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(*argv)


def test_a_repeated_flag_takes_the_last_value_and_is_reported() -> None:
    plan = parse("--tp", "8", "--tensor-parallel-size", "4")
    assert plan.tp_size == 4
    assert plan.repeated == ("--tp-size",)


def test_unknown_flags_pass_through_untouched_for_a_newer_sglang() -> None:
    argv = ["--trust-remote-code", "--model-path", "/m", "--some-new-flag", "x", "--tp", "2"]
    plan = parse_launch_args(argv, rules_for_version("0.7.0").cli())
    assert plan.argv == tuple(argv)
    assert plan.tp_size == 2
    assert plan.unknown == ("--some-new-flag",)


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


def test_redact_argv_hides_every_secret_flag_abbreviations_and_yaml_included() -> None:
    argv = ["--ssl-keyfile-password", "pw-1", "--ssl-keyfile", "/k.pem", "--api-k=sk-2"]
    out = redact_argv(argv)
    assert out == ("--ssl-keyfile-password", "***", "--ssl-keyfile", "/k.pem", "--api-k=***")
    plan = parse_launch_args(
        ["--model-path", "m", "--config", "c.yaml"], config={"ssl-keyfile-password": "pw-yaml"}
    )
    assert plan.secrets == ("pw-yaml",)


@pytest.mark.parametrize("version", sglang_cli_data.VERSIONS)
def test_the_secret_flags_of_each_release_follow_one_rule(version: str) -> None:
    """A flag is secret when it takes a string and a word of its name is a secret word; the
    exceptions are named. What the rule makes of every flag with such a word, release by release:
    a new flag with a secret word fails here until it is judged."""
    table = table_for(version)
    worded = {
        f.names[0]: is_secret_flag(f)
        for f in table.flags
        if any(is_secret_name(n[2:]) for n in f.names)
    }
    assert worded == {
        "--admin-api-key": True,
        "--api-key": True,
        "--ssl-keyfile-password": True,
        "--speculative-token-map": False,  # NOT_SECRET_FLAGS: a path
        "--bucket-inter-token-latency": False,  # numbers
        "--bucket-time-to-first-token": False,
        "--kt-max-deferred-experts-per-token": False,
        "--prefill-delayer-token-usage-low-watermark": False,
        "--tbo-token-distribution-threshold": False,
    }
    assert secret_flag_names(table) == {"--api-key", "--admin-api-key", "--ssl-keyfile-password"}


def test_gpu_ids_with_pipeline_stages_follow_sglangs_formula() -> None:
    """base + pp_rank × tp_per_node + tp_rank × gpu_id_step (docs/sglang.md §3), step on TP only."""
    assert parse("--tp", "2", "--pp-size", "2", "--base-gpu-id", "4").local_gpu_ids() == (
        4,
        5,
        6,
        7,
    )
    stepped = parse("--tp", "2", "--pp-size", "2", "--gpu-id-step", "2")
    assert stepped.local_gpu_ids() == (0, 2, 2, 4)
