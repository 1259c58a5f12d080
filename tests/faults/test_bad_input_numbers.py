"""Every number finite and bounded, wherever it is given: a config key, an option, its
SGLANG_SUPERVISOR_<OPTION> variable. Each bad one is exit 2 naming the key or the option, never
a traceback (docs/faults.md "Bad input").

The first tables are generated from the config's sections and `run`'s options, so a key or an
option added later is held to the same bounds without a new line here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from supervisor.commands.run_options import _DURATION, _RUN_OPTIONS
from tests.faults.bad_input import (
    cli,
    config_fields,
    logging_as_it_was,
    preflight,
    refused,
    write_config,
)


@pytest.fixture(autouse=True)
def _logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from logging_as_it_was(monkeypatch)


def check_config(capsys: pytest.CaptureFixture[str], tmp_path, section: str, key: str, value):
    return refused(capsys, "check-config", str(write_config(tmp_path, {section: {key: value}})))


def test_the_base_config_passes(tmp_path, capsys):
    """The tables below change one key each: without it, check-config passes."""
    code, out, err = cli(capsys, "check-config", str(write_config(tmp_path)))
    assert code == 0, err
    assert "valid" in out


@pytest.mark.parametrize(("section", "key"), config_fields("duration"))
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("1e400s", "longer than 30 days"),  # was inf
        ("721h", "longer than 30 days"),
        ("0.000000001s", "shorter than 1 ms"),  # was a busy loop
        (1e300, "longer than 30 days"),  # a TOML number of seconds
    ],
)
def test_every_duration_key_is_bounded(tmp_path, capsys, section, key, value, why):
    err = check_config(capsys, tmp_path, section, key, value)
    assert f"config key {section}.{key}" in err
    assert why in err


@pytest.mark.parametrize(("section", "key"), config_fields("size"))
@pytest.mark.parametrize("value", ["1e30GB", "1001TB", "1e400GB"])
def test_every_size_key_is_bounded(tmp_path, capsys, section, key, value):
    err = check_config(capsys, tmp_path, section, key, value)
    assert f"config key {section}.{key}" in err
    assert "above 1 PB" in err


@pytest.mark.parametrize(("section", "key"), config_fields("float"))
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_every_float_key_is_finite(tmp_path, capsys, section, key, value):
    """TOML reads nan and inf; nan passed every `<=` rule (ramp_gb_per_second = nan)."""
    err = check_config(capsys, tmp_path, section, key, value)
    assert f"{section}.{key}" in err


@pytest.mark.parametrize(("section", "key"), config_fields("int"))
def test_every_integer_key_is_bounded(tmp_path, capsys, section, key):
    err = check_config(capsys, tmp_path, section, key, 10**18)
    assert f"{section}.{key}" in err


DURATION_OPTIONS = [flag for flag, _field, kind, _help in _RUN_OPTIONS if kind == _DURATION]
INTEGER_OPTIONS = [(flag, field) for flag, field, kind, _help in _RUN_OPTIONS if kind is int]


def dry_run(tmp_path, *options: str) -> list[str]:
    config = write_config(tmp_path)
    return ["run", "--log-format", "console", "--dry-run", "--config", str(config), *options]


@pytest.mark.parametrize("flag", DURATION_OPTIONS)
@pytest.mark.parametrize(
    ("value", "why"),
    [("1e400s", "longer than 30 days"), ("1e10s", "longer"), ("0.000000001s", "shorter")],
)
def test_every_duration_option_is_bounded(tmp_path, capsys, flag, value, why):
    err = refused(capsys, *dry_run(tmp_path, flag, value))
    assert f"'{flag}'" in err
    assert why in err


@pytest.mark.parametrize(("flag", "field"), INTEGER_OPTIONS)
def test_every_integer_option_is_bounded(tmp_path, capsys, flag, field):
    err = refused(capsys, *dry_run(tmp_path, flag, str(10**18)))
    assert f"run.{field}" in err
    assert f"from the option {flag}" in err


def test_a_duration_variable_is_bounded_and_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_SUPERVISOR_HEALTH_TIMEOUT", "1e10s")
    err = refused(capsys, *dry_run(tmp_path))
    assert "--health-timeout" in err
    assert "longer than 30 days" in err


# -- the cases that were found, by name ------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"watchdog": {"ramp_gb_per_second": float("nan")}}, "watchdog.ramp_gb_per_second"),
        ({"watchdog": {"ramp_gb_per_second": float("inf")}}, "watchdog.ramp_gb_per_second"),
        ({"watchdog": {"psi_full_warn_percent": 500.0}}, "psi_full_warn_percent must be at most"),
        ({"watchdog": {"min_interval": "0.000000001s"}}, "watchdog.min_interval"),
        ({"watchdog": {"min_interval": "5ms"}}, "min_interval must be at least 10 ms"),
        ({"watchdog": {"max_interval": "10min"}}, "max_interval must be at most 60 s"),
        ({"preflight": {"load_threads": 10**18}}, "preflight.load_threads must be at most 1,024"),
        ({"host": {"gpus": 10**18}}, "host.gpus (--gpus) must be at most 1,024"),
        ({"host": {"gpu_memory": "1e30GB"}}, "host.gpu_memory"),
        ({"host": {"gpu_memory": "5TiB"}}, "host.gpu_memory (--gpu-memory) must be at most"),
        ({"run": {"health_interval": "1ms"}}, "run.health_interval must be at least 10 ms"),
        (
            {"run": {"health_timeout": "1500ms"}},
            "run.health_timeout (--health-timeout) must be at least 2 s with run.health_path "
            "/health: SGLang's /health is a one-token generation",
        ),
        (
            {"run": {"health_timeout": "1s", "health_path": "/health_generate"}},
            "must be at least 2 s with run.health_path /health_generate",
        ),
        (
            {"host": {"numa": [{"node": 0, "mem_available": "200GB", "gpus": [0, 1, 2, 3]}] * 2}},
            "NUMA node(s) 0 given more than once",
        ),
        (
            {"host": {"numa": [{"node": 4096, "mem_available": "400GB", "gpus": list(range(8))}]}},
            "host.numa.node (--numa) must be at most 1,023",
        ),
        ({"host": {"sglang_version": "0.4.0"}}, "older than every SGLang release"),
    ],
    ids=lambda v: str(v)[:60],
)
def test_a_refused_value_in_the_file_names_its_key(tmp_path, capsys, overrides, message):
    err = refused(capsys, "check-config", str(write_config(tmp_path, overrides)))
    assert message in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--backoff-initial", "1e400s", "--backoff-max", "1e400s"], "'--backoff-initial'"),
        (["--health-timeout", "1e10s"], "'--health-timeout'"),
        (
            ["--health-timeout", "500ms"],
            "run.health_timeout (--health-timeout) must be at least 2 s",
        ),
        (["--stop-grace", "inf"], "'--stop-grace'"),
        (["--failure-threshold", str(10**20)], "from the option --failure-threshold"),
    ],
)
def test_a_refused_run_option_is_named(tmp_path, capsys, options, message):
    assert message in refused(capsys, *dry_run(tmp_path, *options))


def test_a_short_health_timeout_is_taken_on_a_path_that_generates_nothing(tmp_path, capsys):
    """The floor is /health's 1 s sleep: a path without it (/ready) may be probed faster."""
    code, _out, err = cli(
        capsys,
        "check-config",
        str(write_config(tmp_path, {"run": {"health_timeout": "500ms", "health_path": "/ready"}})),
    )
    assert code == 0, err


@pytest.mark.parametrize("value", ["abc", "1e400s", "-5s"])
def test_the_unit_s_stop_timeout_that_does_not_parse_is_refused(
    tmp_path, capsys, monkeypatch, value
):
    """It was ignored: the stop-grace guard silently off."""
    monkeypatch.setenv("SGLANG_SUPERVISOR_STOP_TIMEOUT_S", value)
    err = refused(capsys, *dry_run(tmp_path))
    assert "SGLANG_SUPERVISOR_STOP_TIMEOUT_S" in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--gpus", str(10**20)], "host.gpus (--gpus) must be at most 1,024"),
        (["--gpu-memory", "1e30GB"], "'--gpu-memory': size out of range"),
        (["--mem-available", "1e400GB"], "'--mem-available': size out of range"),
        (["--weights", "2000TB"], "'--weights': size out of range"),
        (["--avg-request-tokens", str(10**12)], "'--avg-request-tokens'"),
        (["--numa", "0:200GB:0-3", "--numa", "0:200GB:4-7"], "NUMA node(s) 0 given more than"),
        (["--numa", "5000:400GB:0-7"], "host.numa.node (--numa) must be at most 1,023"),
        (["--sglang-version", "0.4.0"], "0.4.0 is older than every SGLang release"),
    ],
)
def test_a_refused_preflight_option_is_named(capsys, options, message):
    assert message in refused(capsys, *preflight(*options))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--model-path", "", "--tp", "8"), "--model-path '': must name a model"),
        (("--model-path", "m/x", "--tp", str(10**11)), "more than the 65,536"),  # was a hang
        (("--model-path", "m/x", "--tp", "8", "--dp", str(10**11)), "more than the 65,536"),
        (("--model-path", "m/x", "--tp", "8", "--max-total-tokens", "1" + "0" * 400), "above"),
        (("--model-path", "m/x", "--tp", "8", "--hicache-size", "9" * 300), "at most 1,000,000"),
        (("--model-path", "m/x", "--tp", "8", "--cpu-offload-gb", "9" * 300), "at most 1,000,000"),
        (("--model-path", "/m/" + "x" * 5000, "--tp", "8"), "longer than 4,095 bytes (PATH_MAX)"),
    ],
    ids=["empty", "tp 1e11", "dp 1e11", "400-digit tokens", "hicache", "offload", "5000"],
)
def test_a_refused_server_argument_is_named(capsys, argv, message):
    assert message in refused(capsys, *preflight(argv=argv))
