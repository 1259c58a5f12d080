"""[group]: its keys and defaults, durations like every section's, bad values naming the key
(exit 2, in every command), and the token never shown."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from supervisor import log as sup_log
from supervisor.config import GroupConfig, load_config, read_toml
from supervisor.errors import ConfigError, ExitCode, GroupMustRecreate

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "group-token-not-to-be-seen"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "group.toml"
    path.write_text(text)
    return path


def test_the_defaults_follow_sglang_s_lws_example_and_leave_one_box_alone():
    group = GroupConfig()
    assert (group.mode, group.dist_init_port, group.gate_port) == ("auto", 20000, 30100)
    assert (group.leader_port, group.token) == (0, "")
    assert (group.resolve_timeout_s, group.report_timeout_s) == (600.0, 900.0)
    assert load_config(None).group == group


def test_every_key_loads_with_durations_in_any_unit(tmp_path: Path):
    config = load_config(
        write(
            tmp_path,
            '[group]\nmode = "lws"\ndist_init_port = 5000\ngate_port = 0\nleader_port = 9401\n'
            f'token = "{TOKEN}"\nresolve_timeout = "90s"\nreport_timeout = "1h"\n',
        )
    )
    assert config.group == GroupConfig(
        mode="lws",
        dist_init_port=5000,
        gate_port=0,
        leader_port=9401,
        token=TOKEN,
        resolve_timeout_s=90.0,
        report_timeout_s=3600.0,
    )


def test_the_example_config_shows_every_group_key_with_its_default():
    example = ROOT / "configs" / "run-example.toml"
    keys = set(read_toml(example)["group"])
    assert keys == {f.removesuffix("_s") for f in GroupConfig.__dataclass_fields__}
    assert load_config(example).group == GroupConfig()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('mode = "k8s"', "group.mode must be one of auto|off|lws|rbg|skypilot|env (got 'k8s')"),
        ("mode = 1", "config key group.mode: expected a string"),
        ("dist_init_port = 0", "group.dist_init_port must be a port, 1 to 65535 (got 0)"),
        ("dist_init_port = 65536", "group.dist_init_port must be a port"),
        ('dist_init_port = "20000"', "config key group.dist_init_port: expected an integer"),
        ("gate_port = -1", "group.gate_port must be a port, 1 to 65535, or 0 (got -1)"),
        ("leader_port = 70000", "group.leader_port must be a port, 1 to 65535, or 0 (got 70000)"),
        ("gate_port = 20000", "group.gate_port (20000) must not be group.dist_init_port (20000)"),
        ("gate_port = 20006", "or one of the 6 ports above it"),
        ('resolve_timeout = "0s"', "group.resolve_timeout must be positive"),
        ('report_timeout = "soon"', "config key group.report_timeout: not a duration"),
        ("report_timeout = -5", "config key group.report_timeout"),
        ('token = "short"', "config key group.token must be at least 8 characters long"),
        ("token = 12345678", "config key group.token: expected a string"),
        ("leader = 'x'", "unknown config key group.leader (known keys: dist_init_port"),
    ],
)
def test_bad_group_values_name_the_key(tmp_path: Path, text: str, fragment: str):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, f"[group]\n{text}\n"))
    assert fragment in str(err.value)
    assert err.value.exit_code is ExitCode.BAD_INPUT


def test_gate_ports_clear_of_sglang_s_ports_are_taken():
    assert GroupConfig(gate_port=20007).gate_port == 20007
    assert GroupConfig(gate_port=19999).gate_port == 19999


def test_a_bad_token_is_named_but_never_shown(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, '[group]\ntoken = "has spaces in it"\n'))
    assert "config key group.token must be printable ASCII characters" in str(err.value)
    assert "has spaces" not in str(err.value)
    assert TOKEN not in repr(GroupConfig(token=TOKEN))


def test_a_bad_group_key_stops_preflight_with_exit_2_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from supervisor.cli import main

    config = write(tmp_path, "[group]\ngate_port = 99999\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["preflight", "--config", str(config), "--", "--model-path", "m"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "group.gate_port" in err
    assert "Traceback" not in err


@pytest.fixture
def _logging_as_it_was(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """check-config configures the process's logging: leave it as found for the next test."""
    monkeypatch.setattr(sup_log, "_format", sup_log.configured_format())
    yield
    structlog.reset_defaults()
    sup_log.register_secrets(())


@pytest.mark.usefixtures("_logging_as_it_was")
def test_check_config_never_prints_the_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from supervisor.cli import main

    llama = ROOT / "configs" / "models" / "llama-3-70b" / "config.json"
    config = write(
        tmp_path,
        '[server]\nargs = ["--model-path", "m", "--tp", "2"]\n'
        f"model_config = {json.dumps(str(llama))}\n"
        '[host]\nmem_available = "445GB"\ngpus = 8\ngpu_memory = "141GiB"\n'
        'sglang_version = "0.5.23"\n'
        f'[preflight]\nweights = "40GB"\nledger_dir = "{tmp_path / "ledger"}"\n'
        f'[run]\nname = "check"\nstate_dir = "{tmp_path / "state"}"\n'
        '[gpu]\nbackend = "none"\n'
        f'[group]\nmode = "off"\ntoken = "{TOKEN}"\n',
    )
    for extra in ([], ["--json"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["check-config", str(config), *extra])
        out, err = capsys.readouterr()
        assert exit_info.value.code == 0, err
        assert TOKEN not in out + err


def test_exit_8_says_the_group_must_be_recreated():
    assert int(ExitCode.GROUP_RECREATE) == 8
    assert GroupMustRecreate("the group must be recreated").exit_code is ExitCode.GROUP_RECREATE
