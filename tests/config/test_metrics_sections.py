"""`[http]` and `[metrics]`: off by default, loopback unless allowed, a textfile node_exporter
reads; each refusal names its key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from supervisor.config import SupervisorConfig, load_config, read_toml
from supervisor.config.metrics_sections import HttpConfig, MetricsConfig
from supervisor.errors import ConfigError


def load(tmp_path: Path, text: str) -> SupervisorConfig:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def test_the_listener_and_the_textfile_are_off_by_default(tmp_path):
    config = load(tmp_path, "")
    assert config.http.address is None
    assert config.metrics.textfile == ""


def test_a_loopback_address_is_taken_as_given(tmp_path):
    config = load(tmp_path, '[http]\nlisten = "[::1]:9400"\n')
    assert config.http.address == ("::1", 9400)


def test_a_remote_address_needs_allow_remote(tmp_path):
    with pytest.raises(ConfigError, match=r"http.listen: 0.0.0.0 is not a loopback.*allow_remote"):
        load(tmp_path, '[http]\nlisten = "0.0.0.0:9400"\n')
    config = load(tmp_path, '[http]\nlisten = "0.0.0.0:9400"\nallow_remote = true\n')
    assert config.http.address == ("0.0.0.0", 9400)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[http]\nlisten = "9400"\n', "config key http.listen: '9400' is not HOST:PORT"),
        ('[http]\nlisten = "127.0.0.1:99999"\n', "config key http.listen"),
        ("[http]\nlisten = 9400\n", "config key http.listen: expected a string"),
        ('[http]\nallow_remote = "yes"\n', "config key http.allow_remote: expected true or false"),
        ("[http]\nport = 9400\n", "unknown config key http.port"),
        ('[metrics]\ntextfile = "/tmp/x.txt"\n', "metrics.textfile must end in .prom"),
    ],
)
def test_bad_values_name_their_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load(tmp_path, text)


def test_the_example_config_shows_every_key_with_its_default():
    example = Path(__file__).resolve().parents[2] / "configs" / "run-example.toml"
    data = read_toml(example)
    for section, cls in (("http", HttpConfig), ("metrics", MetricsConfig)):
        assert set(data[section]) == {f.name for f in dataclasses.fields(cls)}
    config = load_config(example)
    assert (config.http, config.metrics) == (HttpConfig(), MetricsConfig())
