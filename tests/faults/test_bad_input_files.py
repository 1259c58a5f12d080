"""Files as bad input: the supervisor's TOML, SGLang's --config YAML, a model's config.json and
safetensors headers, a Hugging Face cache. Every parser has a depth and an expansion limit; a
bad file is exit 2 naming it (a damaged shard header a warning: SGLang's load says the rest),
never a traceback, a hang or a message of megabytes (docs/faults.md "Bad input")."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.bad_input import (
    ARGV,
    QWEN,
    cli,
    config_fields,
    logging_as_it_was,
    preflight,
    refused,
    write_config,
)


@pytest.fixture(autouse=True)
def _logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from logging_as_it_was(monkeypatch)


# -- the supervisor's TOML ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels deep"),
        ("a = " + "[" * 70 + "]" * 70 + "\n", "nested more than 64 levels deep"),
        ("[run]\nmax_restarts = " + "9" * 5000 + "\n", "Exceeds the limit (4300 digits)"),
        ("# " + "x" * (1 << 20) + "\n", "larger than 1 MiB"),
    ],
    ids=["5000 levels", "70 levels", "5000 digits", "over 1 MiB"],
)
@pytest.mark.parametrize("command", ["check-config", "preflight"])
def test_a_toml_file_past_the_parser_s_limits_is_refused(tmp_path, capsys, text, message, command):
    path = tmp_path / "c.toml"
    path.write_text(text)
    args = (
        [command, str(path)] if command == "check-config" else ["preflight", "--config", str(path)]
    )
    err = refused(capsys, *args)
    assert str(path) in err
    assert message in err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ('"A=B" = "1"', "server.env: 'A=B' is not an environment variable name"),
        ('"" = "1"', "server.env: '' is not an environment variable name"),
        ('"A\\u0000" = "1"', "server.env: 'A\\x00' is not an environment variable name"),
        ('A = "x\\u0000y"', "server.env.A: the value holds a NUL character"),
    ],
)
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_server_env_is_refused_by_check_config_as_run_would(
    tmp_path, capsys, env, message, command
):
    """check-config passed these and run died at launch (illegal environment variable name,
    embedded null byte): the section refuses them, for both."""
    path = write_config(tmp_path)
    path.write_text(path.read_text() + f"\n[server.env]\n{env}\n")
    if command == "check-config":
        err = refused(capsys, "check-config", str(path))
    else:
        err = refused(capsys, "run", "--log-format", "console", "--dry-run", "--config", str(path))
    assert message in err


TEXT_FIELDS = config_fields("text")
LIST_FIELDS = {("server", "args"), ("server", "command")} | {
    ("hooks", name) for name in ("on_incident", "on_fatal", "on_ready")
}


@pytest.mark.parametrize(("section", "key"), TEXT_FIELDS)
@pytest.mark.parametrize("value", ["a\0b", "x" * 200_000], ids=["NUL", "200,000 characters"])
def test_every_text_key_is_refused_with_a_nul_or_past_its_length(
    tmp_path, capsys, section, key, value
):
    """A NUL failed only where the OS took the string (a launch, a mkdir, getpwnam: exit 70),
    and a word of 200,000 characters in every log line that quotes it."""
    given = [value] if (section, key) in LIST_FIELDS else value
    err = refused(capsys, "check-config", str(write_config(tmp_path, {section: {key: given}})))
    assert f"config key {section}.{key}" in err


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("server", "model_config"),
        ("preflight", "ledger_dir"),
        ("run", "state_dir"),
        ("metrics", "textfile"),
    ],
)
def test_a_path_key_the_kernel_would_refuse_is_refused_now(tmp_path, capsys, section, key):
    value = f"{tmp_path}/{'x' * 300}.prom"
    err = refused(capsys, "check-config", str(write_config(tmp_path, {section: {key: value}})))
    assert f"config key {section}.{key}" in err
    assert "longer than 255 bytes (NAME_MAX)" in err


def test_a_state_dir_option_the_kernel_would_refuse_is_refused(tmp_path, capsys):
    err = refused(capsys, "status", "--state-dir", f"{tmp_path}/{'x' * 300}")
    assert "--state-dir" in err
    assert "NAME_MAX" in err


def test_a_nul_in_the_server_s_argv_is_refused(tmp_path, capsys):
    config = write_config(tmp_path, {"server": {"args": [*ARGV, "--served-model-name", "a\0b"]}})
    assert "server.args holds a NUL character (got 'a\\x00b')" in refused(
        capsys, "check-config", str(config)
    )


# -- SGLang's --config YAML --------------------------------------------------------------------


def billion_laughs(levels: int = 9) -> str:
    """9 aliases of 9 aliases of ...: 324 bytes that expand to 9^9 items."""
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in itertools.pairwise("abcdefghijklmnop"[: levels + 1]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(20)  # the bomb took 29 s and 2.4 GB
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (billion_laughs(), "its aliases expand to more than 10,000 nodes"),
        (billion_laughs(8) + "tp-size: *i\n", "its aliases expand to more than 10,000 nodes"),
        ("a: &a [*a]\n", "an alias refers to a node that contains it"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels deep"),
        ("x: " + "[" * 70 + "]" * 70 + "\n", "nested more than 64 levels deep"),
        ("a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n", "nest it"),
    ],
    ids=[
        "billion laughs",
        "bomb in a flag",
        "self alias",
        "5000 levels",
        "70 levels",
        "alias depth",
    ],
)
def test_a_yaml_config_past_the_limits_is_refused(tmp_path, capsys, text, message):
    path = tmp_path / "sglang.yaml"
    path.write_text(text)
    err = refused(capsys, *preflight(argv=(*ARGV, "--config", str(path))))
    assert f"launch_server --config {path}" in err
    assert message in err


def test_an_error_quoting_a_long_yaml_value_is_one_clipped_line(tmp_path, capsys):
    """A value of 5,000 long words within every limit: argparse names all of them."""
    path = tmp_path / "sglang.yaml"
    path.write_text("served-model-name: [" + ", ".join(["w" * 100] * 5000) + "]\n")
    err = refused(capsys, *preflight(argv=(*ARGV, "--config", str(path))))
    assert "characters cut" in err  # refused() also holds stderr under 10,000 characters


# -- a model's config.json ---------------------------------------------------------------------


def model_config(tmp_path: Path, **changes: object) -> Path:
    config = json.loads(QWEN.read_text())
    config.update(changes)
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_attention_heads": 0}, "config key num_attention_heads must be 1 to 65,536 (got 0)"),
        ({"num_key_value_heads": 0}, "config key num_key_value_heads must be 1 to 65,536 (got 0)"),
        ({"num_hidden_layers": 10**30}, "config key num_hidden_layers must be 1 to 10,000"),
        ({"num_hidden_layers": 1e30}, "config key num_hidden_layers must be an integer"),
        ({"hidden_size": float("inf")}, "config key hidden_size must be an integer, got inf"),
        ({"head_dim": -128}, "config key head_dim must be 1 to"),
        ({"quantization_config": "fp8"}, "quantization_config must be a JSON object"),
    ],
    ids=["0 heads", "0 kv heads", "1e30 layers", "float layers", "inf hidden", "-128", "fp8"],
)
def test_a_config_json_value_that_cannot_be_planned_is_named(tmp_path, capsys, changes, message):
    path = model_config(tmp_path, **changes)
    (path.parent / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "FP8"}}')
    err = refused(capsys, *preflight(model=path))
    assert f"model config {path}" in err
    assert message in err


def test_a_config_json_nested_past_the_limit_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    err = refused(capsys, *preflight(model=path))
    assert f"{path} is not a model's config: nested more than 64 levels deep" in err


def test_a_config_json_symlink_loop_is_named_as_one(tmp_path, capsys):
    """It read as missing: "has no config.json"."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").symlink_to(model / "loop")
    (model / "loop").symlink_to(model / "config.json")
    err = refused(capsys, *preflight(model=None, argv=("--model-path", str(model), "--tp", "8")))
    assert f"{model / 'config.json'}: it is a symlink loop" in err


@pytest.mark.parametrize("algo", ["INT4", "FP8_E5M2", 8])
def test_a_kv_quant_algo_sglang_ignores_is_a_warning_and_planned_as_sglang_does(
    tmp_path, capsys, algo
):
    """SGLang acts on "FP8" only (any case) and keeps the model dtype otherwise, silently."""
    path = model_config(tmp_path, quantization_config={"kv_cache_quant_algo": algo})
    code, out, _err = cli(capsys, *preflight("--json", model=path))
    assert code == 0
    report = json.loads(out)
    assert report["kv_cache_dtype"] == "bfloat16"
    warned = {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "warn"}
    assert "is not FP8, the only value SGLang acts on" in warned["kv_cache_dtype"]


# -- safetensors headers -----------------------------------------------------------------------


def model_with_shard(tmp_path: Path, header: bytes) -> Path:
    model = tmp_path / "m"
    model.mkdir()
    shutil.copy(QWEN, model / "config.json")
    (model / "model-00001.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return model


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (b"[1, 2]", "the header is a JSON list, not an object"),
        (b'{"w": {"data_offsets": [0, 1e400]}}', "tensor 'w' has no data_offsets"),
        (b'{"w": {"data_offsets": [8, 0]}}', "tensor 'w' has no data_offsets"),
        (b'{"w": {"data_offsets": "0-8"}}', "tensor 'w' has no data_offsets"),
        (b'{"w": [0, 8]}', "tensor 'w' has no data_offsets"),
        (b'{"w": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested more than 64 levels deep"),
        (b"{not json", "damaged header"),
    ],
    ids=["list", "1e400", "backwards", "string", "entry list", "5000 levels", "not json"],
)
def test_one_damaged_shard_header_is_a_warning_naming_it(tmp_path, capsys, header, problem):
    """It was a traceback (AttributeError, OverflowError) in preflight, check-config and run."""
    model = model_with_shard(tmp_path, header)
    argv = ("--model-path", str(model), "--tp", "8")
    code, out, _err = cli(capsys, *preflight("--json", model=None, argv=argv))
    assert code == 0
    warned = {c["name"]: c["detail"] for c in json.loads(out)["checks"] if c["status"] == "warn"}
    assert str(model / "model-00001.safetensors") in warned["weights"]
    assert problem in warned["weights"]
    config = write_config(tmp_path, {"server": {"args": list(argv), "model_config": None}})
    code, _out, err = cli(capsys, "check-config", str(config))
    assert code == 0, err


# -- a Hugging Face cache ----------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["../../../x", "/etc", "..", "a/../../b"])
def test_a_cache_ref_that_leaves_the_cache_is_refused(tmp_path, capsys, monkeypatch, ref):
    repo = tmp_path / "hub" / "models--org--m"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    shutil.copy(QWEN, repo / "snapshots" / "abc" / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(ref)
    (tmp_path / "x").mkdir()
    shutil.copy(QWEN, tmp_path / "x" / "config.json")  # what ../../../x would have read
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    err = refused(capsys, *preflight(model=None, argv=("--model-path", "org/m", "--tp", "8")))
    assert f"Hugging Face cache ref {repo / 'refs' / 'main'} names {ref!r}" in err


def test_a_model_id_whose_cache_folder_the_kernel_refuses_is_named(tmp_path, capsys, monkeypatch):
    """models--org--<250 x> is past NAME_MAX: the stat's OSError was a traceback."""
    (tmp_path / "hub").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    argv = ("--model-path", "org/" + "x" * 250, "--tp", "8")
    err = refused(capsys, *preflight(model=None, argv=argv))
    assert "cannot look up model path 'org/xxx" in err
