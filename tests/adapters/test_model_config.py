"""Finding and reading config.json: local directories, the HF cache, overrides, bad files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supervisor.adapters.model_config import hf_cache_dirs, load_model_config
from supervisor.errors import ConfigError

LLAMA = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}


def model_dir(path: Path, config: object, shards: dict[str, int] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    for name, size in (shards or {}).items():
        with open(path / name, "wb") as fh:
            fh.truncate(size)  # sparse: no real memory or disk
    return path


def test_local_directory_with_shards_gives_config_and_weight_size(tmp_path):
    d = model_dir(tmp_path / "m", LLAMA, {"a.safetensors": 1000, "b.safetensors": 24, "x.bin": 7})
    info = load_model_config(str(d))
    assert info.config["num_key_value_heads"] == 8
    assert info.weights_bytes == 1024
    assert info.largest_shard_bytes == 1000
    assert info.model_dir == str(d)


def test_no_shards_means_unknown_weights(tmp_path):
    assert load_model_config(str(model_dir(tmp_path / "m", LLAMA))).weights_bytes is None


def test_text_config_of_a_multimodal_wrapper_is_merged_over_the_top_level(tmp_path):
    wrapper = {"model_type": "kimi_k25", "torch_dtype": "float32", "text_config": LLAMA}
    info = load_model_config(str(model_dir(tmp_path / "m", wrapper)))
    assert info.config["num_hidden_layers"] == 80
    assert info.config["torch_dtype"] == "bfloat16"
    assert info.config["model_type"] == "kimi_k25"
    assert "text_config" not in info.config


def test_hf_quant_config_declares_fp8_kv(tmp_path):
    d = model_dir(tmp_path / "m", LLAMA)
    quant = {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    (d / "hf_quant_config.json").write_text(json.dumps(quant))
    info = load_model_config(str(d))
    assert info.config["quantization_config"]["kv_cache_quant_algo"] == "FP8"


def test_hub_id_resolves_in_the_local_hf_cache_only(tmp_path):
    hub = tmp_path / "hub"
    repo = hub / "models--meta-llama--Llama-3-70B"
    snap = model_dir(repo / "snapshots" / "abc123", LLAMA, {"model.safetensors": 10})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    model_dir(repo / "snapshots" / "older", {"broken": True})
    info = load_model_config("meta-llama/Llama-3-70B", env={"HF_HUB_CACHE": str(hub)})
    assert info.model_dir == str(snap)
    assert info.weights_bytes == 10


def test_hf_cache_dirs_follow_the_environment(tmp_path):
    dirs = hf_cache_dirs({"HF_HOME": "/h", "HOME": "/home/u"})
    assert dirs == (Path("/h/hub"), Path("/home/u/.cache/huggingface/hub"))


def test_override_wins_and_works_without_the_model(tmp_path):
    override = model_dir(tmp_path / "o", LLAMA)
    info = load_model_config("org/not-downloaded", str(override), env={"HOME": str(tmp_path)})
    assert info.model_dir is None
    assert info.weights_bytes is None
    assert info.config_file == str(override / "config.json")


def test_missing_model_says_it_never_downloads(tmp_path):
    with pytest.raises(ConfigError, match="never downloads"):
        load_model_config("org/absent", env={"HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"no config\.json"):
        load_model_config(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        load_model_config("x", str(tmp_path / "nope.json"))


def test_malformed_config_json_names_the_file_and_line(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(ConfigError, match=r"config.json is not valid JSON: .*line 3"):
        load_model_config(str(d))
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        load_model_config(str(d))
    (d / "config.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_model_config(str(d))


def write_safetensors(path: Path, tensors: dict[str, int]) -> None:
    """A real safetensors file: 8-byte header length, the JSON header, then the data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, size in tensors.items():
        header[name] = {
            "dtype": "BF16",
            "shape": [size // 2],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little") + blob + b"\0" * offset)


def test_tensor_sizes_come_from_the_safetensors_headers(tmp_path):
    d = model_dir(tmp_path / "m", LLAMA)
    write_safetensors(d / "model-00001.safetensors", {"a.q_a_proj.weight": 64, "b.weight": 32})
    write_safetensors(d / "model-00002.safetensors", {"c.weight": 16})
    info = load_model_config(str(d))
    assert info.tensor_bytes == {"a.q_a_proj.weight": 64, "b.weight": 32, "c.weight": 16}


def test_one_unreadable_header_means_no_tensor_list(tmp_path):
    """A partial list would under-count the replicated tensors: all or nothing."""
    d = model_dir(tmp_path / "m", LLAMA, {"b.safetensors": 100})  # zeros: no header
    write_safetensors(d / "a.safetensors", {"x.weight": 8})
    assert load_model_config(str(d)).tensor_bytes is None


# A FIFO never ends (or never opens) when read: each test has a deadline, so a regression fails
# the test instead of hanging the suite.


@pytest.mark.timeout(10)
def test_a_fifo_as_the_model_s_config_json_is_refused(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    os.mkfifo(d / "config.json")
    with pytest.raises(
        ConfigError, match=r"model config .*config\.json is not a regular file \(a FIFO\)"
    ):
        load_model_config(str(d))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_an_override_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    override = tmp_path / "o" / "config.json"
    override.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(override)
    elif kind == "directory":
        # A directory override means its config.json: here that is a directory too.
        (override / "config.json").mkdir(parents=True)
    else:
        override = Path("/dev/null")
    with pytest.raises(ConfigError, match="is not a regular file"):
        load_model_config("org/absent", str(override), env={"HOME": str(tmp_path)})


@pytest.mark.timeout(10)
def test_a_fifo_beside_the_config_is_refused_or_skipped(tmp_path):
    d = model_dir(tmp_path / "m", LLAMA)
    os.mkfifo(d / "hf_quant_config.json")
    with pytest.raises(ConfigError, match=r"hf_quant_config\.json is not a regular file"):
        load_model_config(str(d))
    (d / "hf_quant_config.json").unlink()
    write_safetensors(d / "a.safetensors", {"x.weight": 8})
    os.mkfifo(d / "b.safetensors")  # a shard that is no file: no tensor list, no hang
    assert load_model_config(str(d)).tensor_bytes is None


@pytest.mark.timeout(10)
def test_a_fifo_as_the_hf_cache_ref_falls_back_to_the_newest_snapshot(tmp_path):
    hub = tmp_path / "hub"
    repo = hub / "models--org--m"
    snap = model_dir(repo / "snapshots" / "abc", LLAMA)
    (repo / "refs").mkdir()
    os.mkfifo(repo / "refs" / "main")
    info = load_model_config("org/m", env={"HF_HUB_CACHE": str(hub)})
    assert info.model_dir == str(snap)
