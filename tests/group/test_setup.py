"""The group flags the server's argv already gives, read as SGLang reads them (abbreviations,
aliases, `--name=value`, a `--config` YAML file), so the supervisor fills only what is missing
and refuses what contradicts the group."""

from __future__ import annotations

import pytest

from supervisor.config import SupervisorConfig
from supervisor.core.group import GivenFlags
from supervisor.core.sglang_launch import LaunchReader
from supervisor.core.sglang_versions import rules_for_version
from supervisor.errors import ConfigError
from supervisor.group.setup import given_flags, join_group

READER = LaunchReader(rules_for_version("0.5.23"))
LWS = {
    "LWS_LEADER_ADDRESS": "lead.lws",
    "LWS_GROUP_SIZE": "2",
    "LWS_WORKER_INDEX": "1",
    "SGLANG_SUPERVISOR_GROUP_TOKEN": "a-good-group-token",
}


@pytest.mark.parametrize(
    ("args", "given"),
    [
        ([], GivenFlags(None, None, (), None)),
        (["--nnodes", "2", "--node-rank", "1"], GivenFlags(2, 1, (), None)),
        (["--nnodes=2", "--nnodes", "4"], GivenFlags(4, None, (), None)),  # the last one wins
        (
            ["--nccl-init-addr", "a:1", "--dist-init-addr=b:2"],
            GivenFlags(None, None, ("a:1", "b:2"), None),
        ),
        (["--gated-launch-port", "30100"], GivenFlags(None, None, (), 30100)),
    ],
)
def test_the_given_group_flags_are_read_as_sglang_reads_them(args, given):
    assert given_flags(READER, ["--model-path", "m", "--tp", "4", *args]) == given


def test_the_flags_of_a_config_yaml_count_and_the_command_line_comes_after_them(tmp_path):
    yaml_config = {"nnodes": 2, "dist-init-addr": "lead.lws:20000", "tp-size": 4}
    reader = LaunchReader(READER.rules, yaml_config=yaml_config, yaml_path="x.yaml")
    args = ["--model-path", "m", "--config", "x.yaml", "--dist-init-addr", "lead.lws:20000"]
    assert given_flags(reader, args) == GivenFlags(
        2, None, ("lead.lws:20000", "lead.lws:20000"), None
    )


def test_only_the_missing_flags_are_filled():
    spec, filled = join_group(
        SupervisorConfig(), LWS, ["--model-path", "m", "--tp", "4", "--nnodes", "2"], READER
    )
    assert spec is not None
    assert filled == (
        *("--model-path", "m", "--tp", "4", "--nnodes", "2", "--node-rank", "1"),
        *("--dist-init-addr", "lead.lws:20000", "--gated-launch-port", "30100"),
    )


def test_an_sglang_without_the_gate_gets_no_gate_flag():
    old = LaunchReader(rules_for_version("0.5.18"))
    _spec, filled = join_group(SupervisorConfig(), LWS, ["--model-path", "m", "--tp", "4"], old)
    assert "--gated-launch-port" not in filled


def test_one_box_keeps_its_argv():
    assert join_group(SupervisorConfig(), {}, ["--model-path", "m"], READER) == (
        None,
        ("--model-path", "m"),
    )


def test_a_short_token_is_refused_without_showing_it():
    env = {**LWS, "SGLANG_SUPERVISOR_GROUP_TOKEN": "short"}
    with pytest.raises(ConfigError) as err:
        join_group(SupervisorConfig(), env, ["--model-path", "m", "--tp", "4"], READER)
    assert "SGLANG_SUPERVISOR_GROUP_TOKEN must be at least 8 characters" in str(err.value)
    assert "short" not in str(err.value)
