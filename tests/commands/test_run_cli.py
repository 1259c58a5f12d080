"""`sglang-supervisor run` refuses bad input before anything starts: exit 2, the key or option
named, no traceback; options override the config file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.commands.run_options import merge_run_config, with_model_facts
from supervisor.config import RunConfig, load_config, read_toml
from supervisor.errors import ConfigError

FAKE = f"{sys.executable} -m supervisor.testing.fake_sglang"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(["run", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    code = exc.value.code
    assert isinstance(code, int)
    return code, err


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        ("[run]\nbogus = 1\n", [], "unknown config key run.bogus"),
        ('[run]\nhealth_interval = "-1s"\n', [], "run.health_interval"),
        ("[run]\nfailure_threshold = 0\n", [], "run.failure_threshold must be at least 1"),
        ('[run]\nbackoff_initial = "10s"\nbackoff_max = "1s"\n', [], "run.backoff_max"),
        ('[run]\nmax_restarts = "five"\n', [], "run.max_restarts: expected an integer"),
        ("", ["--health-interval", "0s"], "run.health_interval must be positive"),
        ("", ["--health-interval", "soon"], "--health-interval"),
        ("", ["--oom-score-adj", "5000"], "run.oom_score_adj"),
        ('[run]\ncgroup = "maybe"\n', [], "run.cgroup must be auto or off"),
        ("", ["--cgroup", "maybe"], "--cgroup"),
        ("", ["--server-command", "/nonexistent/python -m x"], "/nonexistent/python: no such file"),
        ("", ["--server-command", "'unterminated"], "--server-command"),
        ("", ["--server-command", "no-such-program-xyz"], "not found on PATH"),
        ('[run]\nstate_dir = "/proc/no/such"\n', [], "state directory /proc/no/such"),
        ('[gpu]\nbackend = "cuda"\n', [], "gpu.backend must be one of auto|nvml|sim|none"),
        ("[host]\nmem_available = 445\n", [], "host.mem_available: 445 has no unit"),
        ('[run]\nname = ".."\n', [], "run.name"),
        # A misspelt option before -- is the supervisor's, never forwarded to SGLang.
        ("", ["--helth-interval", "1s"], "No such option '--helth-interval'"),
        ("[run]\nkeep_files = 0\n", [], "run.keep_files"),
        ("", ["--weights", "lots"], "--weights"),
        ('[server]\nuser = "no-such-user-xyz"\n', [], "config key server.user: no such user"),
        ('[server]\nuser = "nobody"\ngroup = "no-such-grp"\n', [], "server.group: no such group"),
        ('[server]\ngroup = "nogroup"\n', [], "config key server.group ('nogroup') needs"),
    ],
)
def test_bad_input_exits_2_naming_what_is_wrong(tmp_path, capsys, config, options, message):
    path = tmp_path / "run.toml"
    path.write_text(config)
    state = [] if "state_dir" in config else ["--state-dir", str(tmp_path / "state")]
    code, err = run_cli(
        capsys,
        "--config",
        str(path),
        *state,
        *(["--server-command", FAKE] if "--server-command" not in options else []),
        *options,
        "--",
        "--model-path",
        "m",
    )
    assert code == 2
    assert message in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp-size", "two"], "argument --tp-size/--tensor-parallel-size: invalid int value"),
        (["--pp", "2"], "ambiguous option: --pp could match"),
        (["--hicache-storage-backend", "bogus"], "argument --hicache-storage-backend: invalid"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_arguments_sglang_would_reject_exit_3_before_anything_starts(
    tmp_path, capsys, args, message
):
    state = tmp_path / "state"
    code, err = run_cli(
        capsys,
        "--state-dir",
        str(state),
        "--server-command",
        FAKE,
        "--",
        "--model-path",
        "m",
        *args,
    )
    assert code == 3
    assert f"launch_server arguments: {message}" in err
    assert not state.exists()  # nothing claimed, nothing launched


def test_a_missing_model_path_exits_3_in_sglang_s_words(tmp_path, capsys):
    code, err = run_cli(
        capsys, "--state-dir", str(tmp_path), "--server-command", FAKE, "--", "--tp", "2"
    )
    assert code == 3
    assert "the following arguments are required: --model-path/--model" in err


def test_flags_of_a_newer_release_are_refused_for_the_configured_one(tmp_path, capsys):
    """[host] sglang_version 0.5.20 has no --hicache-host-memory-fraction (0.5.21 added it)."""
    path = tmp_path / "run.toml"
    path.write_text('[host]\nsglang_version = "0.5.20"\n')
    argv = ["--model-path", "m", "--hicache-host-memory-fraction", "0.5"]
    code, err = run_cli(
        capsys,
        "--config",
        str(path),
        "--state-dir",
        str(tmp_path / "s"),
        "--server-command",
        FAKE,
        "--",
        *argv,
    )
    assert code == 3
    assert "unrecognized arguments: --hicache-host-memory-fraction" in err
    assert "as SGLang 0.5.20 reads them" in err


@pytest.mark.parametrize(
    ("yaml_name", "text", "message"),
    [
        ("missing.yaml", None, "Config file not found: {path}"),
        ("bad.yaml", "tp: 8\n  x: [\n", "line 2"),
        ("list.yaml", "- tp\n", "must contain a dictionary at root level"),
        ("flags.json", "{}", "must be YAML format"),
    ],
)
def test_a_bad_sglang_config_file_is_bad_input_naming_the_file(
    tmp_path, capsys, yaml_name, text, message
):
    config = tmp_path / yaml_name
    if text is not None:
        config.write_text(text)
    argv = ["--model-path", "m", "--config", str(config)]
    code, err = run_cli(
        capsys, "--state-dir", str(tmp_path / "s"), "--server-command", FAKE, "--", *argv
    )
    assert code == 2
    assert f"launch_server --config {config}" in err
    assert message.format(path=config) in err


def test_an_unknown_sglang_version_is_bad_input(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('[host]\nsglang_version = "banana"\n')
    code, err = run_cli(
        capsys,
        "--config",
        str(path),
        "--state-dir",
        str(tmp_path / "s"),
        "--server-command",
        FAKE,
        "--",
        "--model-path",
        "m",
    )
    assert code == 2
    assert "'banana' is not an SGLang version" in err


def test_no_launch_server_arguments_is_bad_input(tmp_path, capsys):
    code, err = run_cli(capsys, "--state-dir", str(tmp_path), "--server-command", FAKE)
    assert code == 2
    assert "no launch_server arguments" in err


def test_a_stop_grace_that_does_not_fit_the_units_stop_timeout_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_SUPERVISOR_STOP_TIMEOUT_S", "180")
    assert merge_run_config(RunConfig(), {"stop_grace_s": 150.0}).stop_grace_s == 150.0
    with pytest.raises(ConfigError, match=r"run.stop_grace \(151 s\).*TimeoutStopSec \(180 s"):
        merge_run_config(RunConfig(), {"stop_grace_s": 151.0})


def test_model_config_and_weights_options_override_the_file_like_preflight_s(tmp_path, monkeypatch):
    path = tmp_path / "run.toml"
    path.write_text(
        '[server]\nmodel_config = "models/a/config.json"\n[preflight]\nweights = "1GB"\n'
    )
    config = load_config(path)
    assert with_model_facts(config, None, None) == config  # not given: the file's values
    monkeypatch.chdir(tmp_path)
    given = with_model_facts(config, Path("b/config.json"), 16_400_000_000)
    # Relative to where the command runs, not to the config file.
    assert given.server.model_config == str(tmp_path / "b" / "config.json")
    assert given.preflight.weights_bytes == 16_400_000_000


def test_command_line_overrides_the_config_file_and_unset_options_keep_it():
    from_file = RunConfig(health_interval_s=5.0, max_restarts=9)
    merged = merge_run_config(from_file, {"health_interval_s": 0.5, "max_restarts": None})
    assert merged.health_interval_s == 0.5
    assert merged.max_restarts == 9


def test_example_config_shows_every_run_key_with_its_default():
    root = Path(__file__).resolve().parents[2]
    example = root / "configs" / "run-example.toml"
    keys = set(read_toml(example)["run"])
    assert keys == {f.removesuffix("_s") for f in RunConfig.__dataclass_fields__}
    assert load_config(example).run == RunConfig(name="example")
