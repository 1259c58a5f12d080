"""[gpu] health keys: the gate's mode, the DBE threshold, {indices} in the reset command; bad
values name the key (exit 2), in every command."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import GpuConfig, load_config
from supervisor.errors import ConfigError, ExitCode


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpu.toml"
    path.write_text(text)
    return path


def test_the_gate_enforces_by_default_and_passes_no_uncorrectable_error():
    gpu = GpuConfig()
    assert (gpu.health, gpu.max_volatile_dbe) == ("enforce", 0)


def test_health_threshold_and_a_peer_set_reset_command_load(tmp_path: Path):
    config = load_config(
        write(
            tmp_path,
            '[gpu]\nhealth = "warn"\nmax_volatile_dbe = 2\n'
            'reset_command = "nvidia-smi --gpu-reset -i {indices}"\n',
        )
    )
    assert config.gpu.health == "warn"
    assert config.gpu.max_volatile_dbe == 2
    assert config.gpu.reset_command.endswith("{indices}")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[gpu]\nhealth = "strict"\n', "gpu.health must be one of enforce|warn|off (got 'strict')"),
        ("[gpu]\nhealth = true\n", "gpu.health"),
        ("[gpu]\nmax_volatile_dbe = -1\n", "gpu.max_volatile_dbe must be 0 or more"),
        ('[gpu]\nmax_volatile_dbe = "1"\n', "gpu.max_volatile_dbe"),
        (
            '[gpu]\nreset_command = "reset -i {peers}"\n',
            "only {index}, {uuid} and {indices} can be filled in",
        ),
    ],
)
def test_bad_gpu_health_values_name_the_key(tmp_path: Path, text: str, fragment: str):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert fragment in str(err.value)
    assert err.value.exit_code is ExitCode.BAD_INPUT


def test_a_bad_health_mode_stops_preflight_with_exit_2_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from supervisor.cli import main

    config = write(tmp_path, '[gpu]\nhealth = "sometimes"\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["preflight", "--config", str(config), "--", "--model-path", "m"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "gpu.health" in err
    assert "Traceback" not in err


def test_the_example_config_shows_every_gpu_key_with_its_default():
    from supervisor.config import read_toml

    example = Path(__file__).resolve().parents[2] / "configs" / "run-example.toml"
    keys = set(read_toml(example)["gpu"])
    assert keys == {
        f.removesuffix("_s").removesuffix("_bytes") for f in GpuConfig.__dataclass_fields__
    }
    assert load_config(example).gpu == GpuConfig()
