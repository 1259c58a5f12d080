"""[log] server_output and [run] log_format / --log-format: accepted values, and bad ones
refused with exit 2 naming the key or option (as an event where the log is JSON)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from supervisor.cli import main
from supervisor.config import LogConfig, load_config, read_toml
from supervisor.errors import ConfigError

FAKE = f"{sys.executable} -m supervisor.testing.fake_sglang"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def test_server_output_defaults_to_json_and_takes_raw(tmp_path: Path) -> None:
    assert load_config(None).log == LogConfig(server_output="json")
    path = tmp_path / "c.toml"
    path.write_text('[log]\nserver_output = "raw"\n\n[run]\nlog_format = "journal"\n')
    config = load_config(path)
    assert config.log.server_output == "raw"
    assert config.run.log_format == "journal"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[log]\nserver_output = "text"\n', "log.server_output must be json or raw"),
        ('[log]\nformat = "json"\n', "unknown config key log.format"),
        ('[run]\nlog_format = "syslog"\n', "run.log_format must be auto, json, console or journal"),
    ],
)
def test_bad_values_name_their_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(["run", *argv])
    code = exc.value.code
    assert isinstance(code, int)
    return code, capsys.readouterr().err


def test_a_bad_server_output_exits_2_as_a_fatal_event_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[log]\nserver_output = "text"\n')
    code, err = run_cli(
        capsys, "--config", str(path), "--log-format", "json", "--", "--model-path", "m"
    )
    assert code == 2
    (line,) = err.splitlines()
    fatal = json.loads(line)
    assert (fatal["event"], fatal["exit_code"]) == ("fatal", 2)
    assert "log.server_output must be json or raw" in fatal["reason"]


@pytest.mark.parametrize("given", [["--log-format", "json"], ["--log-format=json"]])
def test_a_usage_error_in_json_mode_is_one_fatal_event(
    capsys: pytest.CaptureFixture[str], given: list[str]
) -> None:
    code, err = run_cli(capsys, *given, "--helth-interval", "1s", "--", "--model-path", "m")
    assert code == 2
    (line,) = err.splitlines()
    fatal = json.loads(line)
    assert (fatal["event"], fatal["exit_code"]) == ("fatal", 2)
    assert "No such option '--helth-interval'" in fatal["reason"]


def test_a_bad_log_format_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = run_cli(capsys, "--log-format", "syslog", "--", "--model-path", "m")
    assert code == 2
    assert "'--log-format'" in err
    assert "journal" in err  # the choices are named


def test_a_usage_error_on_a_console_stays_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(capsys, "--log-format", "console", "--helth-interval", "1s")
    assert code == 2
    assert err.startswith("Usage: ")
    assert "Error: No such option '--helth-interval'" in err


def test_the_example_config_shows_the_log_section_with_its_defaults() -> None:
    example = Path(__file__).resolve().parents[2] / "configs" / "run-example.toml"
    assert set(read_toml(example)["log"]) == set(LogConfig.__dataclass_fields__)
    assert load_config(example).log == LogConfig()
