"""`run` in group mode from the command line: the group's variables and the server's flags are
checked before anything starts (exit 2 naming the variable or flag), and `run --dry-run` shows
the group's flags filled in and the group, never its token."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from supervisor import log as sup_log
from supervisor.cli import main

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "configs" / "models" / "llama-3-70b" / "config.json"
FAKE = f"{sys.executable} -m supervisor.testing.fake_sglang"
TOKEN = "cli-group-token-42"
LWS = {"LWS_LEADER_ADDRESS": "sglang-0.sglang", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
GROUP_ENV = (
    *LWS,
    "RBG_LWP_LEADER_ADDRESS",
    "RBG_LWP_GROUP_SIZE",
    "RBG_LWP_WORKER_INDEX",
    "SKYPILOT_NODE_RANK",
    "SKYPILOT_NODE_IPS",
    "SKYPILOT_NUM_NODES",
    "SGLANG_SUPERVISOR_GROUP_LEADER",
    "SGLANG_SUPERVISOR_GROUP_SIZE",
    "SGLANG_SUPERVISOR_GROUP_RANK",
    "SGLANG_SUPERVISOR_GROUP_TOKEN",
    "POD_IP",
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No group variable of the host leaks in; logging is left as found."""
    for name in GROUP_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sup_log, "_format", sup_log.configured_format())
    yield
    structlog.reset_defaults()
    sup_log.register_secrets(())


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(
        f"[server]\nmodel_config = {json.dumps(str(LLAMA))}\n"
        '[host]\nmem_available = "445GB"\ngpus = 8\ngpu_memory = "141GiB"\n'
        'sglang_version = "0.5.23"\n'
        f'[preflight]\nweights = "40GB"\nledger_dir = "{tmp_path / "ledger"}"\n'
        f'[run]\nname = "group"\nstate_dir = "{tmp_path / "state"}"\n'
        '[gpu]\nbackend = "none"\n' + extra
    )
    return path


def run_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str, extra: str = ""
) -> tuple[int, str, str]:
    argv = ["run", "--log-format", "json", "--config", str(config(tmp_path, extra))]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--server-command", FAKE, "--dry-run", "--", "--model-path", "m", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert isinstance(exc.value.code, int)
    return exc.value.code, out, err


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({}, ["--tp", "6", "--nnodes", "3"], "LWS_GROUP_SIZE=2 but --nnodes 3 in the server"),
        ({}, ["--tp", "4", "--node-rank", "0"], "LWS_WORKER_INDEX=1 but --node-rank 0"),
        ({"LWS_WORKER_INDEX": "3"}, ["--tp", "4"], "LWS_WORKER_INDEX=3 is out of range for"),
        ({"LWS_GROUP_SIZE": "two"}, ["--tp", "4"], "LWS_GROUP_SIZE='two' is not an integer"),
        (
            {},
            ["--tp", "4", "--dist-init-addr", "sglang-0.sglang:20000", "--nccl-init-addr", "x:1"],
            "--dist-init-addr is given twice in the server arguments with different values",
        ),
        (
            {},
            ["--tp", "4", "--dist-init-addr=other-host:20000"],
            "names host other-host but LWS_LEADER_ADDRESS=sglang-0.sglang",
        ),
        ({}, ["--tp", "3"], "the server arguments do not fit a group of 2 nodes"),
        ({"SGLANG_SUPERVISOR_GROUP_TOKEN": ""}, ["--tp", "4"], "group mode needs a token"),
        ({"SKYPILOT_NODE_RANK": "0"}, ["--tp", "4"], "set [group] mode to the one to follow"),
        (
            {"LWS_LEADER_ADDRESS": None, "LWS_WORKER_INDEX": None},
            ["--tp", "4"],
            "LWS_LEADER_ADDRESS, LWS_WORKER_INDEX are not set",
        ),
    ],
)
def test_bad_group_input_exits_2_naming_it(tmp_path, capsys, monkeypatch, env, args, message):
    for name, value in {**LWS, "SGLANG_SUPERVISOR_GROUP_TOKEN": TOKEN, **env}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    code, _out, err = run_cli(capsys, tmp_path, *args)
    assert code == 2
    assert message in err
    assert not (tmp_path / "state").exists()  # nothing claimed, nothing launched


def test_a_dry_run_shows_the_filled_flags_and_the_group_but_never_the_token(
    tmp_path, capsys, monkeypatch
):
    for name, value in LWS.items():
        monkeypatch.setenv(name, value)
    extra = f'[group]\ntoken = "{TOKEN}"\ngate_port = 30200\n[http]\nlisten = "127.0.0.1:9555"\n'
    code, out, err = run_cli(capsys, tmp_path, "--tp", "16", "--nnodes", "2", extra=extra)
    assert code == 0
    view = json.loads(out)
    assert view["argv"] == [
        *("--model-path", "m", "--tp", "16", "--nnodes", "2", "--node-rank", "1"),
        *("--dist-init-addr", "sglang-0.sglang:20000", "--gated-launch-port", "30200"),
    ]
    assert view["group"] == {
        "mode": "lws",
        "size": 2,
        "node_rank": 1,
        "leader": "sglang-0.sglang",
        "dist_init_addr": "sglang-0.sglang:20000",
        "gate_port": 30200,
        "leader_report_url": "http://sglang-0.sglang:9555/group/report",
        "token": "***",
    }
    assert TOKEN not in out + err
    assert view["limits"]["restarts"]["in_place"] is False


def test_the_text_preview_of_a_group_node_says_it_never_restarts_in_place():
    text = _restart_text(in_place=False)
    assert "never in place (group mode)" in text
    assert "doubling" not in text
    assert "doubling" in _restart_text(in_place=True)


def test_a_group_of_one_node_is_one_box(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "sglang-0.sglang")
    monkeypatch.setenv("LWS_GROUP_SIZE", "1")
    monkeypatch.setenv("LWS_WORKER_INDEX", "0")
    code, out, _err = run_cli(capsys, tmp_path, "--tp", "2")
    assert code == 0
    view = json.loads(out)
    assert view["group"] is None
    assert "--nnodes" not in view["argv"]


def test_mode_off_ignores_the_launchers_variables(tmp_path, capsys, monkeypatch):
    for name, value in LWS.items():
        monkeypatch.setenv(name, value)
    code, out, _err = run_cli(capsys, tmp_path, "--tp", "2", extra='[group]\nmode = "off"\n')
    assert code == 0
    assert json.loads(out)["group"] is None


def _restart_text(*, in_place: bool) -> str:
    from supervisor.commands.check_config import _restart_line

    restarts = {
        "in_place": in_place,
        "backoff_initial_s": 10.0,
        "backoff_max_s": 300.0,
        "stable_after_s": 600.0,
        "max_restarts": 5,
        "restart_window_s": 3600.0,
        "restart_on_reload": True,
    }
    return _restart_line(restarts)
