"""The config loader names the key that is wrong and never lets a typo pass silently."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[preflight]\navg_request_tokens = -1\n",
            "preflight.avg_request_tokens must be at least 1",
        ),
        (
            "[preflight]\navg_request_tokens = 0\n",
            "preflight.avg_request_tokens must be at least 1",
        ),
        ('[gpu]\nbackend = "cuda"\n', r"gpu.backend must be one of auto\|nvml\|sim\|none"),
        ("[host]\nmem_available = 445\n", "host.mem_available: 445 has no unit: write 445GB or"),
        ('[host]\nmem_available = "445"\n', "host.mem_available: 445 has no unit"),
        ('[watchdog]\nkill = "2147483648"\n', "watchdog.kill: 2147483648 has no unit"),
        (
            '[host]\ngpu_memory = "0GB"\n',
            r"host.gpu_memory \(--gpu-memory\) must be at least 1 GiB",
        ),
        ("[host]\ngpus = 0\n", r"host.gpus \(--gpus\) must be at least 1"),
        (
            '[host]\ngpus = 8\n[[host.numa]]\nnode = 0\nmem_available = "200GB"\ngpus = [9, 10]\n',
            r"node 0 lists GPU\(s\) 9, 10 beyond the 8 GPUs",
        ),
        (
            '[[host.numa]]\nnode = 0\nmem_available = "1GB"\ngpus = [0, 1]\n'
            '[[host.numa]]\nnode = 1\nmem_available = "1GB"\ngpus = [1]\n',
            r"GPU\(s\) 1 listed on more than one NUMA node",
        ),
        ('[run]\nname = "."\n', "run.name"),
        ('[run]\nname = ".."\n', "run.name"),
        ('[run]\nname = "a/b"\n', "run.name"),
    ],
)
def test_impossible_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, text))


def test_a_bare_zero_size_stays_zero(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, '[watchdog]\nwarn = 0\nterminate = "0"\nkill = "0B"\n'))
    assert (config.watchdog.warn_bytes, config.watchdog.kill_bytes) == (0, 0)


def test_a_config_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[run]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"config file .*latin1\.toml is not UTF-8 text"):
        load_config(path)


@pytest.mark.timeout(10)  # a regression blocks in open() on the FIFO: fail, never hang
@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_config_path_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "c.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/null")  # a character device: read as an empty config before
    with pytest.raises(ConfigError, match=f"config file {path} is not a regular file"):
        load_config(path)
