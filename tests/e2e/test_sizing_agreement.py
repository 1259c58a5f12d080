"""The pre-flight's prediction against what the simulated SGLang server allocates: the same
argv, the same (simulated) GPUs, two independent transcriptions of SGLang's sizing. An error
in the pre-flight's arithmetic (supervisor/core/fit.py) shows up here as a disagreement."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main
from supervisor.core.units import GiB, MiB
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

LLAMA_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}
KIMI_K2: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}
WEIGHTS_PER_RANK = 30 * GiB


def _preflight(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    """The pre-flight's JSON for `argv` on the simulated GPUs (FAKE_GPU_STATE_DIR is set)."""
    facts = ["--mem-available", "2000GB", "--gpu-backend", "sim"]
    facts += ["--weights", f"{WEIGHTS_PER_RANK * 2}B"]
    with pytest.raises(SystemExit):
        main(["preflight", "--json", *facts, "--", *argv])
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def _allocated(log: str) -> tuple[int, int]:
    """(device tokens, host pool tokens) from the simulated server's SGLang log lines."""
    device = re.search(r"KV Cache is allocated\. .*#tokens: (\d+)", log)
    host = re.search(r"hierarchical KV host pool: (\d+) tokens", log)
    assert device is not None, log
    assert host is not None, log
    return int(device.group(1)), int(host.group(1))


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        (LLAMA_70B, ["--hicache-size", "40"]),
        (LLAMA_70B, ["--hicache-ratio", "1.5", "--mem-fraction-static", "0.85"]),
        (LLAMA_70B, []),  # the default ratio, the automatic fraction of an H200
        (KIMI_K2, ["--hicache-ratio", "2", "--page-size", "64"]),
    ],
)
def test_the_preflight_predicts_the_pools_the_server_allocates(
    config: dict[str, Any],
    extra: list[str],
    tmp_path: Path,
    free_port: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    make_gpu_state: Callable[..., Path],
    start_fake_server: Callable[..., Any],
):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    gpus = make_gpu_state(2, total_bytes=143_771 * MiB)  # H200s
    monkeypatch.setenv("FAKE_GPU_STATE_DIR", str(gpus))
    argv = ["--model-path", str(model), "--tp-size", "2", "--enable-hierarchical-cache", *extra]
    predicted = _preflight(capsys, [*argv, "--port", str(free_port)])
    scenario = {
        "weight_bytes_per_rank": WEIGHTS_PER_RANK,
        "cuda_context_bytes": 2 * GiB,  # the pre-flight's default [preflight] gpu_context
    }
    server = start_fake_server(argv, scenario, state_dir=gpus, port=free_port)
    wait_until(lambda: server.status() == 200, timeout_s=60, what="simulated server ready")
    device, host = _allocated(server.log_text())
    assert (predicted["device_tokens_per_rank"], predicted["host_pool_tokens_per_rank"]) == (
        device,
        host,
    )
