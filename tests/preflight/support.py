"""What the pre-flight tests share: the seed box's facts, and running the CLI in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "configs" / "kimi-k2.5-8x-rtx-pro-6000.toml"
KIMI = ROOT / "configs" / "models" / "kimi-k2.5" / "config.json"
LLAMA = ROOT / "configs" / "models" / "llama-3-70b" / "config.json"
SEED_FACTS = ["--mem-available", "445GB", "--gpus", "8", "--gpu-memory", "97887MiB"]
SEED_FACTS += ["--weights", "595GB", "--model-config", str(KIMI)]
KIMI_ARGS = ["--model-path", "moonshotai/Kimi-K2.5", "--tp-size", "8"]
KIMI_ARGS += ["--mem-fraction-static", "0.88", "--kv-cache-dtype", "bf16"]
KIMI_ARGS += ["--enable-hierarchical-cache"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`sglang-supervisor ARGS` in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run(capsys, "preflight", "--json", *args)
    assert not err, err
    return code, json.loads(out)
