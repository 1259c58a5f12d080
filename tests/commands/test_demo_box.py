"""The demo simulates the seed box: the model it plans is the shipped Kimi-K2.5 config."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.commands import demo

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_model_is_the_shipped_kimi_k2_5_config() -> None:
    shipped = json.loads((ROOT / "configs" / "models" / "kimi-k2.5" / "config.json").read_text())
    assert shipped == demo.kimi_k2_5()


def test_the_demo_box_is_the_seed_box_of_the_example_config(tmp_path: Path) -> None:
    """Same GPUs, RAM and weights as configs/kimi-k2.5-8x-rtx-pro-6000.toml."""
    seed = (ROOT / "configs" / "kimi-k2.5-8x-rtx-pro-6000.toml").read_text()
    text = demo.demo_config_text(tmp_path, tmp_path / "model")
    for line in ('gpu_memory = "97887MiB"', 'mem_available = "445GB"', 'weights = "595GB"'):
        assert line in seed
        assert line in text
