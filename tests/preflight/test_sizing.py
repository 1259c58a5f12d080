"""The device pool per rank: estimated near SGLang's own number on the seed box, and exactly
SGLang's once a run of the same deployment has measured it."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.core.measured import Measurement, Record, device_settings
from supervisor.core.sglang_args import parse_launch_args
from supervisor.core.units import GiB
from supervisor.preflight import run_preflight
from supervisor.preflight.measurements import FILE_NAME, load_records, save_record
from tests.preflight.support import SEED, run_json

# What SGLang reported for the seed deployment ("KV Cache is allocated. ... #tokens: 159K").
SGLANG_SEED_TOKENS = 159_000


@pytest.fixture
def seed(tmp_path: Path) -> Path:
    """The seed box's config with a state directory of its own."""
    models = SEED.parent / "models"
    text = SEED.read_text().replace('model_config = "models/', f'model_config = "{models}/')
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "seed.toml"
    path.write_text(text + f'\n[run]\nstate_dir = "{state}"\n')
    return path


def measure(config_path: Path, tokens: int) -> None:
    """What `run` files when a launch of the seed deployment reaches ready."""
    config = load_config(config_path)
    report = run_preflight(config, config.server.args, config_dir=config_path.parent)
    assert report.deployment is not None
    measured = Measurement(
        pre_load_free_bytes=int(93.2 * GiB),
        weights_bytes=int(72.1 * GiB),
        device_tokens=tokens,
        host_pool_tokens=4_268_935,
    )
    settings = device_settings(parse_launch_args(config.server.args))
    record = Record(deployment=report.deployment, settings=settings, measurement=measured, at=1.0)
    save_record(config.run.state_path, record)


def test_the_seed_estimate_is_within_15_percent_of_what_sglang_reported(capsys, seed):
    _, data = run_json(capsys, "--config", str(seed))
    assert data["device_tokens_source"] == "estimate"
    tokens = data["device_tokens_per_rank"]
    assert abs(tokens - SGLANG_SEED_TOKENS) / SGLANG_SEED_TOKENS <= 0.15, tokens
    detail = next(c["detail"] for c in data["checks"] if c["name"] == "device_kv")
    assert "replicated 2.8 GB from config.json" in detail
    assert "multimodal reserve 0.1 GB" in detail


def test_once_measured_the_next_preflight_uses_sglang_s_own_number(capsys, seed):
    measure(seed, tokens=159_104)
    _, data = run_json(capsys, "--config", str(seed))
    assert (data["device_tokens_per_rank"], data["device_tokens_source"]) == (159_104, "measured")
    assert data["weights_per_rank_bytes"] == int(72.1 * GiB)
    detail = next(c["detail"] for c in data["checks"] if c["name"] == "device_kv")
    assert "as SGLang measured it" in detail


def test_other_pool_flags_reuse_the_measured_weights_but_estimate_the_tokens(capsys, seed):
    measure(seed, tokens=159_104)
    config = load_config(seed)
    argv = [*config.server.args, "--mem-fraction-static", "0.80"]  # the last one wins
    _, data = run_json(capsys, "--config", str(seed), "--", *argv)
    assert data["device_tokens_source"] == "estimate"
    assert data["weights_per_rank_bytes"] == int(72.1 * GiB)
    assert data["device_tokens_per_rank"] < 159_104


def test_another_gpu_model_or_release_does_not_use_the_measurement(capsys, seed):
    measure(seed, tokens=159_104)
    _, other = run_json(capsys, "--config", str(seed), "--sglang-version", "0.5.22")
    assert other["device_tokens_source"] == "estimate"


def test_a_damaged_record_file_is_a_warning_not_a_failure(capsys, seed):
    (load_config(seed).run.state_path / FILE_NAME).write_text("{not json")
    code, data = run_json(capsys, "--config", str(seed))
    assert code == 1  # the seed's 300 GB still does not fit; the plan was made
    warning = next(c for c in data["checks"] if c["name"] == "measured")
    assert warning["status"] == "warn"
    assert "unreadable" in warning["detail"]


def test_saving_replaces_a_damaged_file_and_keeps_a_bounded_list(seed):
    state = load_config(seed).run.state_path
    (state / FILE_NAME).write_text("[]")
    for tokens in range(10):
        measure(seed, tokens=150_000 + tokens)
    records, problem = load_records(state)
    assert problem is None
    assert len(records) == 4
    assert records[-1].measurement.device_tokens == 150_009
