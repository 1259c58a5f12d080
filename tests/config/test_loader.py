"""The config loader names the key that is wrong and never lets a typo pass silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.core.units import GB, GiB
from supervisor.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config.preflight.reserve_bytes == 10 * GiB
    assert config.server.args == ()


def test_sizes_and_tables_are_parsed(tmp_path: Path) -> None:
    config = load_config(
        _write(
            tmp_path,
            """
[server]
args = ["--model-path", "/m", "--tp", "8"]
env = { CUDA_LAUNCH_BLOCKING = "0" }
[host]
mem_available = "445GB"
[[host.numa]]
node = 1
mem_available = "200GB"
gpus = [4, 5, 6, 7]
[preflight]
reserve = "12GiB"
""",
        )
    )
    assert config.server.args == ("--model-path", "/m", "--tp", "8")
    assert config.server.env == {"CUDA_LAUNCH_BLOCKING": "0"}
    assert config.host.mem_available_bytes == 445 * GB
    assert config.host.numa[0].gpus == (4, 5, 6, 7)
    assert config.preflight.reserve_bytes == 12 * GiB


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[preflight]\nreserv = 1\n", "unknown config key preflight.reserv"),
        ("[preflgiht]\n", r"unknown config section \[preflgiht\]"),
        ('[preflight]\navg_request_tokens = "many"\n', "preflight.avg_request_tokens: expected"),
        ('[preflight]\nreserve = "10 parsecs"\n', "preflight.reserve: unknown size unit"),
        ("[server]\nargs = [1, 2]\n", "server.args: expected a list of strings"),
        ("[[host.numa]]\ngpus = [0]\n", r"host.numa\[0\].node is required"),
        ("[server]\nargs = = 1\n", "not valid TOML.*line 2"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, text))


def test_unreadable_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.toml"):
        load_config(tmp_path / "missing.toml")
