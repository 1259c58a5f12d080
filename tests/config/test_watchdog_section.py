"""[watchdog] and [gpu] config sections: defaults, units, contradictions named by key (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import GpuConfig, WatchdogConfig, load_config
from supervisor.errors import ConfigError, ExitCode


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_are_consistent_and_units_parse(tmp_path: Path):
    config = load_config(
        write(
            tmp_path,
            '[watchdog]\nkill = "1GiB"\nterminate_grace = "2s"\nmin_hicache_size = "4GB"\n'
            '[gpu]\nreset_command = "nvidia-smi --gpu-reset -i {index}"\n'
            'release_timeout = "3min"\n',
        )
    )
    assert config.watchdog.kill_bytes == 2**30
    assert config.watchdog.terminate_grace_s == 2.0
    assert config.watchdog.min_hicache_size_bytes == 4 * 10**9
    assert config.gpu.release_timeout_s == 180.0
    assert config.gpu.reset_command.endswith("{index}")
    assert WatchdogConfig().shrink_factor == 0.75
    assert GpuConfig().release_timeout_s == 120.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            '[watchdog]\nkill = "10GiB"\n',
            "watchdog.kill (10737418240) must be below watchdog.terminate",
        ),
        ("[watchdog]\nterminate_percent = 9.0\n", "watchdog.terminate_percent"),
        ('[watchdog]\nwarn = "1GiB"\n', "must be below watchdog.warn"),
        ("[watchdog]\nshrink_factor = 1.5\n", "watchdog.shrink_factor"),
        ("[watchdog]\nwarn_percent = 150.0\n", "watchdog.warn_percent"),
        ('[watchdog]\nmin_interval = "2s"\n', "watchdog.min_interval"),
        ("[watchdog]\nwarn_ticks = 0\n", "watchdog.warn_ticks"),
        ('[watchdog]\nkill = "lots"\n', "watchdog.kill"),
        ("[watchdog]\nkill_level = 3\n", "unknown config key watchdog.kill_level"),
        ('[gpu]\nrelease_timeout = "0s"\n', "gpu.release_timeout must be positive"),
        ('[gpu]\nreset_command = "reset -i {gpu}"\n', "gpu.reset_command"),
        ('[gpu]\nreset_command = "reset \'unterminated"\n', "gpu.reset_command"),
        ('[gpu]\nreset_command = "  "\n', "gpu.reset_command is blank"),
    ],
)
def test_bad_watchdog_and_gpu_values_name_the_key(tmp_path: Path, text: str, fragment: str):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert fragment in str(err.value)
    assert err.value.exit_code is ExitCode.BAD_INPUT


def test_a_zero_form_switches_that_form_off_without_contradiction():
    config = WatchdogConfig(warn_percent=0.0, terminate_percent=0.0, kill_percent=3.0)
    assert config.kill_percent == 3.0


def test_run_refuses_a_reset_command_that_cannot_run_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from supervisor.cli import main

    config = write(
        tmp_path,
        f'[run]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[gpu]\nbackend = "none"\nreset_command = "{tmp_path}/no-such-reset -i {{index}}"\n',
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--config", str(config), "--", "--model-path", "m"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no-such-reset" in err
    assert "does not exist" in err
    assert "Traceback" not in err
    assert not (tmp_path / "state").exists()
