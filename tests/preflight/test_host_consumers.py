"""`sglang-supervisor preflight` counts SGLang's opt-in host consumers in its arithmetic and JSON,
warns about the ones SGLang gives no size for, and refuses (exit 2) sizes SGLang cannot read."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.checks import Status
from supervisor.core.units import GB, GiB, MiB
from supervisor.preflight import run_preflight
from tests.core.test_offload import llama_tensors
from tests.preflight.support import KIMI_ARGS, LLAMA, run, run_json
from tests.preflight.test_hybrid import QWEN_NEXT, SIZE
from tests.preflight.test_hybrid import model as hybrid_model
from tests.preflight.test_measured import fake_gpus, fake_host, gpu, measured_config

LLAMA_FACTS = ["--mem-available", "2000GB", "--gpus", "8", "--gpu-memory", "141GB"]
LLAMA_FACTS += ["--weights", "141GB", "--model-config", str(LLAMA)]
LLAMA_ARGS = ["--model-path", "meta-llama/Llama-3.3-70B", "--tp-size", "8"]
LLAMA_ARGS += ["--enable-hierarchical-cache", "--hicache-size", "100"]


def consumers(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in data["host_consumers"]}


def test_counted_consumers_are_in_the_json_the_arithmetic_and_the_budget(capsys):
    args = [*LLAMA_ARGS, "--hicache-storage-backend", "mooncake", "--tokenizer-worker-num", "4"]
    _, before = run_json(capsys, *LLAMA_FACTS, "--", *LLAMA_ARGS)
    code, data = run_json(capsys, *LLAMA_FACTS, "--", *args)
    assert code == 0
    found = consumers(data)
    assert found["mooncake"]["bytes"] == 8 * (4 * GiB // 8 + 16 * MiB)
    assert found["mooncake"]["holder"] == "rank"
    assert found["tokenizers"]["bytes"] == 4 * 6 * GiB  # [preflight] main_overhead each
    terms = {t["term"]: t["bytes"] for t in data["arithmetic"]}
    assert terms["--hicache-storage-backend mooncake 0.6 GB × 8"] == -found["mooncake"]["bytes"]
    assert terms["--tokenizer-worker-num 4 6.4 GB × 4"] == -24 * GiB
    added = data["host_required_bytes"] - before["host_required_bytes"]
    assert added == found["mooncake"]["bytes"] + 24 * GiB
    assert data["max_hicache_size_gb"] < before["max_hicache_size_gb"]


def test_the_human_report_shows_each_counted_consumer_and_each_warning(capsys):
    args = [*LLAMA_ARGS, "--enable-memory-saver", "--enable-weights-cpu-backup"]
    args += ["--lora-paths", "a=/adapters/a"]
    code, out, _ = run(capsys, "preflight", *LLAMA_FACTS, "--", *args)
    assert code == 0
    assert "− --enable-weights-cpu-backup 17.6 GB × 8" in out
    assert "ok    weights_backup counted: --enable-weights-cpu-backup" in out
    assert "warn  lora           --lora-paths (1 adapter)" in out


def test_a_consumer_that_does_not_fit_makes_the_launch_a_no_fit(capsys):
    facts = [*LLAMA_FACTS[2:], "--mem-available", "985GB"]
    _, fits = run_json(capsys, *facts, "--", *LLAMA_ARGS)
    args = [*LLAMA_ARGS, "--enable-memory-saver", "--enable-weights-cpu-backup"]
    code, data = run_json(capsys, *facts, "--", *args)
    assert fits["verdict"] == "fit"
    assert (code, data["verdict"]) == (1, "no-fit")
    failed = {c["name"] for c in data["checks"] if c["status"] == "fail"}
    assert failed == {"host_memory"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MOONCAKE_GLOBAL_SEGMENT_SIZE": "4GiB"}, "MOONCAKE_GLOBAL_SEGMENT_SIZE='4GiB'"),
        ({"MOONCAKE_GLOBAL_SEGMENT_SIZE": "-8"}, "must not be negative"),
    ],
)
def test_a_size_in_the_servers_environment_sglang_cannot_read_exits_2(
    capsys, monkeypatch, env, message
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = [*LLAMA_ARGS, "--hicache-storage-backend", "mooncake"]
    code, out, err = run(capsys, "preflight", *LLAMA_FACTS, "--", *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offload-mode", "disk"], "--offload-mode 'disk': must be one of"),
        (["--hisparse-config", "{"], "--hisparse-config '{': not JSON"),
        (["--enable-hisparse", "--hisparse-config", '{"host_to_device_ratio": 0}'], "ratio 0"),
        (["--kt-num-gpu-experts", "-4"], "--kt-num-gpu-experts -4: must not be negative"),
    ],
)
def test_a_bad_consumer_flag_exits_2_naming_it(capsys, args, message):
    code, out, err = run(capsys, "preflight", *LLAMA_FACTS, "--", *LLAMA_ARGS, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in out + err


def test_cpu_offload_gb_is_gib_per_rank_in_power_of_two_blocks_from_the_headers(capsys, tmp_path):
    model = tmp_path / "llama"
    model.mkdir()
    shutil.copy(LLAMA, model / "config.json")
    header, offset = {}, 0
    for name, size in llama_tensors().items():
        header[name] = {
            "dtype": "BF16",
            "shape": [size // 2],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    facts = ["--mem-available", "2000GB", "--gpus", "8", "--gpu-memory", "141GB"]
    facts += ["--weights", "141GB"]
    args = ["--model-path", str(model), "--tp-size", "8", "--cpu-offload-gb", "1"]
    _, data = run_json(capsys, *facts, "--", *args)
    terms = {t["term"]: t["bytes"] for t in data["arithmetic"]}
    # Five layers and the sixth's qkv_proj, rounded block by block (tests/core/test_offload.py).
    assert terms["--cpu-offload-gb × 8"] == -8 * 1_292_009_472
    note = next(c for c in data["checks"] if c["name"] == "cpu_offload")
    assert note["status"] == "ok"


def test_a_file_backend_on_a_tmpfs_of_this_host_is_counted(tmp_path, monkeypatch):
    ram = tmp_path / "ram"
    ram.mkdir()
    probe = fake_host(tmp_path)
    mounts = f"21 1 0:1 / / rw - ext4 /dev/sda1 rw\n22 21 0:2 / {ram} rw - tmpfs tmpfs rw\n"
    (tmp_path / "proc" / "self" / "mountinfo").write_text(mounts)
    real = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        if Path(path) != ram:
            return real(path)
        blocks = (50 * GiB) // 4096
        return os.statvfs_result((4096, 4096, 2 * blocks, blocks, blocks, 0, 0, 0, 0, 255, 0))

    monkeypatch.setattr(os, "statvfs", statvfs)
    args = [*KIMI_ARGS, "--hicache-size", "10", "--hicache-storage-backend", "file"]
    env = {"PATH": "/nonexistent", "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(ram / "kv")}
    gpus = fake_gpus(tuple(gpu(i, node=i // 4) for i in range(8)))

    def preflight(extra_env: dict[str, str]):
        return run_preflight(
            measured_config(), args, gpu_sensor=gpus, probe=probe, env=env | extra_env
        )

    uncapped = preflight({})
    (files,) = uncapped.host_consumers
    assert (files["name"], files["bytes"], files["holder"]) == ("file_backend", 50 * GiB, "node")
    note = next(c for c in uncapped.checks if c.name == "file_backend")
    assert note.status is Status.WARN
    assert "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE" in note.detail
    capped = preflight({"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "1G"})
    (files,) = capped.host_consumers
    assert (files["bytes"], files["holders"]) == (8 * GB, 8)


def test_a_hybrid_models_consumers_count_in_its_pool_by_pool_plan(capsys):
    """Qwen3-Next at TP 8: hf3fs maps a page of the attention pool and one Mamba slot per entry
    (tests/core/test_storage_consumers.py works the numbers), and the pools' safe size shrinks."""
    facts = hybrid_model("qwen3-next-80b-a3b", "160GB")
    argv = [*QWEN_NEXT, *SIZE]
    _, before = run_json(capsys, *facts, "--", *argv)
    code, data = run_json(capsys, *facts, "--", *argv, "--hicache-storage-backend", "hf3fs")
    assert code == 0
    assert [p["pool"] for p in data["pools"]] == ["mamba", "kv"]
    hf3fs = consumers(data)["hf3fs"]
    assert (hf3fs["each_bytes"], hf3fs["holders"]) == (256 * (6144 + 9_658_368), 8)
    terms = {t["term"]: t["bytes"] for t in data["arithmetic"]}
    assert terms["--hicache-storage-backend hf3fs 2.5 GB × 8"] == -hf3fs["bytes"]
    added = data["host_required_bytes"] - before["host_required_bytes"]
    assert added == hf3fs["bytes"] == 19_792_920_576
    assert data["max_hicache_size_gb"] < before["max_hicache_size_gb"]
