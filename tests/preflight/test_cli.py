"""`sglang-supervisor preflight` end to end: verdicts, JSON, --print-args, bad input (exit 2)."""

from __future__ import annotations

import os

import pytest

from supervisor.core.units import GB, GiB
from tests.preflight.support import KIMI_ARGS, LLAMA, ROOT, SEED, SEED_FACTS, run, run_json

# --- the seed box --------------------------------------------------------------------------


def test_seed_config_refuses_300_and_prints_the_safe_size(capsys):
    code, out, _ = run(capsys, "preflight", "--config", str(SEED))
    assert code == 1
    assert "NO FIT" in out
    assert "safe --hicache-size 49" in out
    assert "host KV pool 300.0 GB × 8" in out


def test_seed_config_json_schema(capsys):
    code, data = run_json(capsys, "--config", str(SEED))
    assert code == 1
    assert data["verdict"] == "no-fit"
    assert data["local_ranks"] == 8
    assert data["bytes_per_token_per_rank"] == 70_272
    assert 45 <= data["max_hicache_size_gb"] <= 50
    assert data["host_required_bytes"] > data["host_budget_bytes"]
    assert data["device_tokens_per_rank"] > 0
    assert data["host_pool_bytes_per_rank"] == (300 * GB // 70_272 + 1) * 70_272
    failed = {c["name"] for c in data["checks"] if c["status"] == "fail"}
    assert failed == {"host_memory"}


def test_seed_box_with_48_gb_fits(capsys):
    code, data = run_json(capsys, *SEED_FACTS, "--", *KIMI_ARGS, "--hicache-size", "48")
    assert code == 0
    assert data["verdict"] == "fit"


def test_print_args_substitutes_the_safe_size_in_place_and_hides_secrets(capsys):
    args = [*KIMI_ARGS, "--hicache-size=300", "--api-key", "s3cret", "--port", "30001"]
    code, out, err = run(capsys, "preflight", "--print-args", *SEED_FACTS, "--", *args)
    assert code == 0
    line = out.strip()
    assert line.endswith(
        '--enable-hierarchical-cache --hicache-size=49 --api-key "$API_KEY" --port 30001'
    )
    assert "s3cret" not in out + err
    assert "export API_KEY" in err


def test_print_args_takes_every_secret_flag_from_a_shell_variable(capsys):
    args = [*KIMI_ARGS, "--ssl-keyfile-password", "pw-s3cret", "--admin-api-key=adm-s3cret"]
    code, out, err = run(capsys, "preflight", "--print-args", *SEED_FACTS, "--", *args)
    assert code == 0
    assert '--ssl-keyfile-password "$SSL_KEYFILE_PASSWORD"' in out
    assert '--admin-api-key="$ADMIN_API_KEY"' in out
    assert "s3cret" not in out + err
    assert "export SSL_KEYFILE_PASSWORD and ADMIN_API_KEY" in err


def test_print_args_when_nothing_fits_exits_1(capsys):
    facts = [*SEED_FACTS[2:], "--mem-available", "55GB"]
    code, _out, err = run(capsys, "preflight", "--print-args", *facts, "--", *KIMI_ARGS)
    assert code == 1
    assert "no --hicache-size fits" in err


def test_dp_size_2_doubles_the_local_ranks(capsys):
    args = [*KIMI_ARGS, "--hicache-size", "30", "--dp-size", "2"]
    code, data = run_json(capsys, *SEED_FACTS, "--", *args)
    assert data["local_ranks"] == 16
    assert code == 1


def test_a_lopsided_numa_node_fails_on_that_node(capsys):
    numa = ["--numa", "0:400GB:0-3", "--numa", "1:45GB:4,5,6,7"]
    args = [*KIMI_ARGS, "--hicache-size", "40"]
    code, data = run_json(capsys, *SEED_FACTS, *numa, "--", *args)
    assert code == 1
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status["host_memory"] == "ok"
    assert status["numa_node0"] == "ok"
    assert status["numa_node1"] == "fail"


def test_avg_request_tokens_changes_what_the_safe_size_buys(capsys):
    _, small = run_json(capsys, "--config", str(SEED), "--avg-request-tokens", "1000")
    _, default = run_json(capsys, "--config", str(SEED))
    assert small["safe_concurrent_requests"] == small["safe_host_tokens_per_rank"] // 1000
    assert default["avg_request_tokens"] == 4096


def test_ratio_mode_without_gpu_facts_reports_the_unknown_device_pool(capsys):
    facts = ["--mem-available", "445GB", "--model-config", str(LLAMA), "--gpu-backend", "none"]
    args = ["--model-path", "x/y", "--tp", "8", "--enable-hicache", "--hicache-ratio", "2"]
    code, data = run_json(capsys, *facts, "--", *args)
    assert code == 1
    assert data["device_tokens_per_rank"] is None
    assert data["host_pool_bytes_per_rank"] is None
    host_pool = next(c for c in data["checks"] if c["name"] == "host_pool")
    assert "the device pool is unknown" in host_pool["detail"]
    assert data["max_hicache_size_gb"] > 0  # size mode needs no device pool


EXAMPLES = (
    "kimi-k2.5-8x-rtx-pro-6000.toml",
    "deepseek-v3-8x-h200.toml",
    "llama-3-70b-8x-h100.toml",
    "qwen3-235b-a22b-8x-h200.toml",
)


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_preflight_examples_load_and_answer(capsys, name):
    code, data = run_json(capsys, "--config", str(ROOT / "configs" / name))
    assert code == (1 if name.startswith("kimi") else 0)
    assert data["max_hicache_size_gb"] > 0


def test_auto_mode_follows_the_sglang_version(capsys):
    """Neither size nor ratio: 0.5.20 uses ratio 2.0; 0.5.21 added auto-sizing from host memory."""
    facts = [*SEED_FACTS, "--mem-available", "200GB"]  # the last one given wins
    _, old = run_json(capsys, *facts, "--sglang-version", "0.5.20", "--", *KIMI_ARGS)
    _, new = run_json(capsys, *facts, "--sglang-version", "0.5.21", "--", *KIMI_ARGS)
    assert (old["hicache_mode"], old["hicache_ratio"]) == ("ratio", 2.0)
    assert new["hicache_mode"] == "auto"
    assert 0 < new["hicache_ratio"] < 2.0
    assert new["host_pool_bytes_per_rank"] < old["host_pool_bytes_per_rank"]
    assert (old["sglang_rules"], new["sglang_rules"]) == ("SGLang 0.5.20", "SGLang 0.5.21")


def test_buffer_only_auto_sizing_never_exceeds_its_default_ratio_of_1_2(capsys):
    args = [*KIMI_ARGS, "--hicache-host-memory-mode", "buffer_only"]
    _, data = run_json(capsys, *SEED_FACTS, "--mem-available", "4000GB", "--", *args)
    assert (data["hicache_mode"], data["hicache_ratio"]) == ("auto", 1.2)


def test_older_sglang_is_flagged_for_not_catching_the_overcommit(capsys):
    """0.5.18 checks each rank against the whole host (the per-host division came in 0.5.19)."""
    args = [*KIMI_ARGS, "--hicache-size", "300"]
    _, data = run_json(capsys, *SEED_FACTS, "--sglang-version", "0.5.18", "--", *args)
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status["sglang_check"] == "warn"
    _, newer = run_json(capsys, *SEED_FACTS, "--sglang-version", "0.5.19", "--", *args)
    assert "sglang_check" not in {c["name"] for c in newer["checks"]}


def test_sglang_s_yaml_config_plans_like_the_equivalent_argv(capsys, tmp_path):
    """The seed deployment written as SGLang's --config file: same ranks, same host pool."""
    config = tmp_path / "kimi.yaml"
    config.write_text(
        "tp-size: 8\nmem-fraction-static: 0.88\nkv-cache-dtype: bf16\n"
        "enable-hierarchical-cache: true\nhicache-size: 48\n"
    )
    argv = ["--model-path", "moonshotai/Kimi-K2.5", "--config", str(config)]
    _, from_yaml = run_json(capsys, *SEED_FACTS, "--", *argv)
    _, from_argv = run_json(capsys, *SEED_FACTS, "--", *KIMI_ARGS, "--hicache-size", "48")
    assert from_yaml["local_ranks"] == from_argv["local_ranks"] == 8
    assert from_yaml["host_pool_bytes_per_rank"] == from_argv["host_pool_bytes_per_rank"]
    assert from_yaml["host_pool_bytes_per_rank"] == 683_061 * 70_272  # SGLang's own, 48 GB


def test_a_repeated_flag_takes_the_last_value_with_a_warning(capsys):
    _, data = run_json(capsys, *SEED_FACTS, "--", *KIMI_ARGS, "--tp", "4")
    assert data["local_ranks"] == 4
    warning = next(c for c in data["checks"] if c["name"] == "sglang_args")
    assert warning["status"] == "warn"
    assert "SGLang takes the last value: --tp-size" in warning["detail"]


def test_an_sglang_newer_than_every_table_passes_unknown_flags_on_with_a_warning(capsys):
    args = [*KIMI_ARGS, "--hicache-size", "48", "--flag-from-the-future", "1"]
    code, data = run_json(capsys, *SEED_FACTS, "--sglang-version", "0.6.0", "--", *args)
    assert code == 0
    warning = next(c for c in data["checks"] if c["name"] == "sglang_args")
    assert "passed on unchecked: --flag-from-the-future" in warning["detail"]


def test_cpu_offload_and_disabled_mmap_enter_the_arithmetic(capsys):
    args = [*KIMI_ARGS, "--hicache-size", "10", "--cpu-offload-gb", "5"]
    args += ["--weight-loader-disable-mmap"]
    _, data = run_json(capsys, *SEED_FACTS, "--", *args)
    terms = {t["term"]: t["bytes"] for t in data["arithmetic"]}
    # 5 GiB per rank (not GB); no tensor list here, so torch's power-of-two worst case, twice.
    assert terms["--cpu-offload-gb × 8"] == -8 * 2 * 5 * GiB
    # (8 loader threads + 2) × 5 GB shards × 8 ranks outweighs 8 × 10 GB of pools.
    assert terms["weight-load buffers (no mmap)"] == -400 * GB
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status["weight_loading"] == "warn"
    assert status["cpu_offload"] == "warn"
    assert status["host_memory"] == "fail"


# --- bad input: message and exit code 2 ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "--model-path", "/nonexistent/model", "--tp", "8"], "neither a local directory"),
        ([*SEED_FACTS, "--", *KIMI_ARGS, "--hicache-size", "-5"], "--hicache-size -5: must not"),
        ([*SEED_FACTS, "--", *KIMI_ARGS, "--hicache-size", "1.5"], "invalid int value: '1.5'"),
        (["--mem-available", "445XB", "--", *KIMI_ARGS], "unknown size unit 'XB'"),
        ([*SEED_FACTS, "--", *KIMI_ARGS, "--nnodes", "3"], "contradicting flags"),
        ([*SEED_FACTS, "--", *KIMI_ARGS, "--tp_size", "4"], "SGLang spells --tp_size as --tp-size"),
        ([*SEED_FACTS, "--", "--tp", "8"], "required: --model-path/--model"),
        ([*SEED_FACTS, "--", *KIMI_ARGS, "--hicache-storage-backend", "bogus"], "invalid choice"),
        ([*SEED_FACTS, "--", *KIMI_ARGS, "--cuda-graph-max-bs", "8"], "ambiguous option"),
        ([*SEED_FACTS, "--sglang-version", "banana", "--", *KIMI_ARGS], "'banana' is not an"),
        (
            [*SEED_FACTS, "--", *KIMI_ARGS, "--config", "/nonexistent/kimi.yaml"],
            "launch_server --config /nonexistent/kimi.yaml: Config file not found",
        ),
        ([*SEED_FACTS], "no launch_server arguments"),
        ([*SEED_FACTS, "--numa", "zero:1GB", "--", *KIMI_ARGS], "NODE:SIZE"),
        ([*SEED_FACTS, "--model-config", "/nonexistent.json", "--", *KIMI_ARGS], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_message(capsys, args, message):
    code, out, err = run(capsys, "preflight", *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out


def test_malformed_model_config_names_the_file(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 61,,}')
    code, _, err = run(
        capsys, "preflight", *SEED_FACTS, "--model-config", str(bad), "--", *KIMI_ARGS
    )
    assert code == 2
    assert f"model config {bad} is not valid JSON" in err
    assert "line 1" in err


def test_model_dir_without_config_json_is_bad_input(capsys, tmp_path):
    code, _, err = run(
        capsys, "preflight", "--mem-available", "1TB", "--", "--model-path", str(tmp_path)
    )
    assert code == 2
    assert "has no config.json" in err


def test_config_lacking_geometry_names_the_key(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"num_attention_heads": 8, "hidden_size": 1024}')
    code, _, err = run(
        capsys, "preflight", *SEED_FACTS, "--model-config", str(bad), "--", *KIMI_ARGS
    )
    assert code == 2
    assert "num_hidden_layers" in err


def test_config_with_zero_kv_bytes_per_token_is_bad_input(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 0, "num_attention_heads": 8, "hidden_size": 1024}')
    code, out, err = run(
        capsys, "preflight", *SEED_FACTS, "--model-config", str(bad), "--", *KIMI_ARGS
    )
    assert code == 2
    assert "num_hidden_layers" in err
    assert "Traceback" not in err + out


def test_an_unexpected_exception_exits_70_as_an_internal_error(capsys, monkeypatch):
    import supervisor.preflight

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(supervisor.preflight, "run_preflight", broken)
    code, _, err = run(capsys, "preflight", *SEED_FACTS, "--", *KIMI_ARGS)
    assert code == 70
    assert "RuntimeError: boom" in err
    assert "internal error" in err


def test_toml_syntax_error_gives_the_line(capsys, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[server]\nargs = ["--tp", "8"\n\n[host]\n')
    code, _, err = run(capsys, "preflight", "--config", str(cfg))
    assert code == 2
    assert "not valid TOML" in err
    assert "line" in err


def test_config_key_of_the_wrong_type_is_named(capsys, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[host]\ngpus = "eight"\n')
    code, _, err = run(capsys, "preflight", "--config", str(cfg), "--", *KIMI_ARGS)
    assert code == 2
    assert "host.gpus" in err


def test_unknown_size_unit_in_the_config_is_named(capsys, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[preflight]\nreserve = "10 gigs"\n')
    code, _, err = run(capsys, "preflight", "--config", str(cfg), "--", *KIMI_ARGS)
    assert code == 2
    assert "preflight.reserve" in err


def test_on_this_host_other_instances_starting_are_counted_from_the_ledger(capsys, tmp_path):
    """Planning nothing (no --mem-available): the host is read, and so is the ledger."""
    from supervisor.adapters.ledger import Ledger
    from tests.adapters.test_ledger import as_pid

    ledger_dir = tmp_path / "ledger"
    as_pid(Ledger(ledger_dir, "neighbour"), os.getppid()).set(planned_bytes=3 * GB)
    config = tmp_path / "c.toml"
    config.write_text(f'[preflight]\nledger_dir = "{ledger_dir}"\n')
    args = ["--config", str(config), "--model-config", str(LLAMA), "--gpu-backend", "none"]
    args += ["--gpus", "2", "--gpu-memory", "80GiB"]
    launch = ["--", "--model-path", "m", "--tp", "2"]
    _, data = run_json(capsys, *args, *launch)
    ledger = next(c for c in data["checks"] if c["name"] == "ledger")
    assert ledger["detail"].startswith("3.0 GB planned and not yet pinned")
    assert "(neighbour)" in ledger["detail"]
    _, planned = run_json(capsys, *args, "--mem-available", "445GB", *launch)
    assert not any(c["name"] == "ledger" for c in planned["checks"]), "another host's plan"
