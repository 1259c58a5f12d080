"""Group mode, pure: which node of which group the launcher's variables say this is, and the
server flags filled in (or checked) so that every node's ranks form one group."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.group import (
    GivenFlags,
    GroupError,
    GroupMode,
    GroupSpec,
    detect_family,
    detect_group,
    fill_group_argv,
    group_token,
)
from supervisor.core.group_address import format_host_port, parse_host, split_host_port

LWS = {"LWS_LEADER_ADDRESS": "sglang-0.sglang", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
RBG = {
    "RBG_LWP_LEADER_ADDRESS": "rbg-leader.ns",
    "RBG_LWP_GROUP_SIZE": "4",
    "RBG_LWP_WORKER_INDEX": "0",
}
SKY = {
    "SKYPILOT_NODE_RANK": "2",
    "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n10.0.0.7\n",
    "SKYPILOT_NUM_NODES": "3",
}
ENV = {
    "SGLANG_SUPERVISOR_GROUP_LEADER": "head.example",
    "SGLANG_SUPERVISOR_GROUP_SIZE": "2",
    "SGLANG_SUPERVISOR_GROUP_RANK": "0",
}
OTHER = {"PATH": "/usr/bin", "HOSTNAME": "pod-1"}


def detect(env: dict[str, str], mode: str = "auto") -> GroupSpec | None:
    return detect_group(env, mode, dist_init_port=20000, gate_port=30100)


def failure(env: dict[str, str], mode: str = "auto") -> str:
    with pytest.raises(GroupError) as err:
        detect(env, mode)
    return str(err.value)


# -- detection -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (LWS, GroupSpec(GroupMode.LWS, 2, 1, "sglang-0.sglang", 20000, 30100)),
        (RBG, GroupSpec(GroupMode.RBG, 4, 0, "rbg-leader.ns", 20000, 30100)),
        (SKY, GroupSpec(GroupMode.SKYPILOT, 3, 2, "10.0.0.5", 20000, 30100)),
        (ENV, GroupSpec(GroupMode.ENV, 2, 0, "head.example", 20000, 30100)),
    ],
)
def test_each_launcher_s_variables_are_found_by_auto_and_by_their_own_mode(env, expected):
    assert detect({**OTHER, **env}) == expected
    assert detect({**OTHER, **env}, expected.mode.value) == expected
    assert expected.is_leader is (expected.node_rank == 0)


def test_no_group_variables_is_one_box_and_off_ignores_them():
    assert detect(OTHER) is None
    assert detect_family(OTHER, "auto") is None
    assert detect({**LWS, **SKY}, "off") is None  # off wins even over two launchers
    assert detect_family(LWS, "off") is None


def test_two_launchers_at_once_ask_for_a_mode_naming_both():
    message = failure({**LWS, **SKY})
    assert "LWS_LEADER_ADDRESS" in message
    assert "SKYPILOT_NODE_RANK" in message
    assert "set [group] mode" in message
    # Naming the one to follow settles it.
    assert detect({**LWS, **SKY}, "skypilot") == detect(SKY)


def test_one_variable_of_a_family_counts_as_present_and_the_missing_ones_are_named():
    message = failure({"LWS_GROUP_SIZE": "2"})
    assert "LWS_LEADER_ADDRESS, LWS_WORKER_INDEX are not set" in message
    assert "LWS_GROUP_SIZE set" in message


def test_an_explicit_mode_without_its_variables_names_them_all():
    message = failure(OTHER, "rbg")
    assert "RBG_LWP_LEADER_ADDRESS, RBG_LWP_GROUP_SIZE, RBG_LWP_WORKER_INDEX" in message
    assert "are not set" in message


def test_an_unknown_mode_is_refused():
    assert "[group] mode must be one of auto|off|lws|rbg|skypilot|env" in failure(LWS, "k8s")


def test_a_group_of_one_node_is_no_group():
    assert detect({**LWS, "LWS_GROUP_SIZE": "1", "LWS_WORKER_INDEX": "0"}) is None
    one = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.5", "SKYPILOT_NUM_NODES": "1"}
    assert detect(one) is None
    # One node needs no leader: an empty address does not stop it.
    assert (
        detect({**ENV, "SGLANG_SUPERVISOR_GROUP_SIZE": "1", "SGLANG_SUPERVISOR_GROUP_LEADER": ""})
        is None
    )
    assert detect_family(one, "auto") is GroupMode.SKYPILOT  # the shell logs group_single_node


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"LWS_WORKER_INDEX": "3"}, "LWS_WORKER_INDEX=3 is out of range for LWS_GROUP_SIZE=2"),
        ({"LWS_WORKER_INDEX": "2"}, "LWS_WORKER_INDEX=2 is out of range for LWS_GROUP_SIZE=2"),
        ({"LWS_WORKER_INDEX": "-1"}, "LWS_WORKER_INDEX=-1 is out of range for LWS_GROUP_SIZE=2"),
        ({"LWS_WORKER_INDEX": "one"}, "LWS_WORKER_INDEX='one' is not an integer"),
        ({"LWS_WORKER_INDEX": ""}, "LWS_WORKER_INDEX='' is not an integer"),
        ({"LWS_GROUP_SIZE": "2.0"}, "LWS_GROUP_SIZE='2.0' is not an integer"),
        ({"LWS_GROUP_SIZE": "²"}, "LWS_GROUP_SIZE='²' is not an integer"),
        ({"LWS_GROUP_SIZE": "0"}, "LWS_GROUP_SIZE=0 must be at least 1"),
        ({"LWS_GROUP_SIZE": "-2"}, "LWS_GROUP_SIZE=-2 must be at least 1"),
        ({"LWS_LEADER_ADDRESS": ""}, "LWS_LEADER_ADDRESS is empty"),
        ({"LWS_LEADER_ADDRESS": "  "}, "LWS_LEADER_ADDRESS is empty"),
        ({"LWS_LEADER_ADDRESS": "leader:20000"}, "is not a host name or IP address (no port"),
        ({"LWS_LEADER_ADDRESS": "http://leader"}, "is not a host name or IP address"),
        ({"LWS_LEADER_ADDRESS": "two words"}, "is not a host name or IP address"),
        ({"LWS_LEADER_ADDRESS": "[leader]"}, "is not a host name or IP address"),
    ],
)
def test_bad_lws_values_name_the_variable_and_its_value(changes, message):
    assert message in failure({**LWS, **changes})


def test_values_with_surrounding_blanks_are_read_and_ipv6_leaders_lose_their_brackets():
    env = {"LWS_LEADER_ADDRESS": " [fd00::0:1] ", "LWS_GROUP_SIZE": " 3 ", "LWS_WORKER_INDEX": "+2"}
    spec = detect(env)
    assert spec is not None
    assert (spec.leader_host, spec.size, spec.node_rank) == ("fd00::1", 3, 2)
    assert spec.dist_init_addr == "[fd00::1]:20000"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"SKYPILOT_NODE_IPS": ""}, "SKYPILOT_NODE_IPS is empty"),
        ({"SKYPILOT_NODE_IPS": "\n \n"}, "SKYPILOT_NODE_IPS is empty"),
        (
            {"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6"},
            "SKYPILOT_NODE_IPS lists 2 address(es) but SKYPILOT_NUM_NODES=3",
        ),
        (
            {"SKYPILOT_NODE_RANK": "3"},
            "SKYPILOT_NODE_RANK=3 is out of range for SKYPILOT_NUM_NODES=3",
        ),
        (
            {"SKYPILOT_NODE_IPS": "10.0.0.5:22 b c"},
            "SKYPILOT_NODE_IPS (its first entry)='10.0.0.5:22'",
        ),
    ],
)
def test_bad_skypilot_values_name_the_variable(changes, message):
    assert message in failure({**SKY, **changes})


def test_skypilot_node_ips_may_be_separated_by_spaces():
    spec = detect({**SKY, "SKYPILOT_NODE_IPS": "10.0.0.9 10.0.0.6  10.0.0.7"})
    assert spec is not None
    assert spec.leader_host == "10.0.0.9"


@given(size=st.integers(1, 64), rank=st.integers(-70, 70))
def test_a_rank_is_accepted_exactly_when_it_is_inside_the_group(size, rank):
    env = {"SGLANG_SUPERVISOR_GROUP_LEADER": "h", "SGLANG_SUPERVISOR_GROUP_SIZE": str(size),
           "SGLANG_SUPERVISOR_GROUP_RANK": str(rank)}  # fmt: skip
    if not 0 <= rank < size:
        with pytest.raises(GroupError):
            detect(env)
        return
    spec = detect(env)
    assert spec is None if size == 1 else (spec is not None and spec.node_rank == rank)


# -- the token -----------------------------------------------------------------------------------


def test_the_token_comes_from_the_config_else_the_environment_and_is_never_shown():
    assert (
        group_token("from-the-config", {"SGLANG_SUPERVISOR_GROUP_TOKEN": "x" * 9})
        == "from-the-config"
    )
    assert group_token("", {"SGLANG_SUPERVISOR_GROUP_TOKEN": "from-the-env"}) == "from-the-env"
    with pytest.raises(GroupError, match="set SGLANG_SUPERVISOR_GROUP_TOKEN"):
        group_token("", {})
    with pytest.raises(GroupError) as err:
        group_token("", {"SGLANG_SUPERVISOR_GROUP_TOKEN": "has a space"})
    assert "SGLANG_SUPERVISOR_GROUP_TOKEN must be printable ASCII" in str(err.value)
    assert "has a space" not in str(err.value)
    with pytest.raises(GroupError, match=r"\[group\] token must be at least 8"):
        group_token("short", {})


# -- the server's flags --------------------------------------------------------------------------

SPEC = GroupSpec(GroupMode.LWS, 2, 1, "sglang-0.sglang", 20000, 30100)
ARGV = ("--model-path", "m", "--tp", "8")


NOTHING = GivenFlags(nnodes=None, node_rank=None, dist_init_addrs=(), gated_launch_port=None)


def fill(spec: GroupSpec = SPEC, *, gate: bool = True, **given: Any) -> tuple[str, ...]:
    flags = dataclasses.replace(NOTHING, **given)
    return fill_group_argv(ARGV, spec, given=flags, gate_supported=gate)


def refusal(spec: GroupSpec = SPEC, **given: Any) -> str:
    with pytest.raises(GroupError) as err:
        fill(spec, **given)
    return str(err.value)


def test_every_group_flag_is_appended_when_the_argv_gives_none():
    assert fill() == (
        *ARGV,
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "sglang-0.sglang:20000",
        "--gated-launch-port", "30100",
    )  # fmt: skip


def test_the_gate_flag_goes_only_to_an_sglang_that_has_it_and_only_with_a_gate_port():
    assert "--gated-launch-port" not in fill(gate=False)
    no_gate = GroupSpec(GroupMode.LWS, 2, 0, "sglang-0.sglang", 20000, 0)
    assert "--gated-launch-port" not in fill(no_gate)
    # Every node gets it, the leader as much as a worker: all ranks take part in the broadcast.
    leader = GroupSpec(GroupMode.LWS, 2, 0, "sglang-0.sglang", 20000, 30100)
    assert fill(leader)[-2:] == ("--gated-launch-port", "30100")


def test_flags_given_with_the_group_s_values_are_kept_not_added_twice():
    out = fill(
        nnodes=2,
        node_rank=1,
        dist_init_addrs=("SGLANG-0.sglang.:20000", "sglang-0.sglang:20000"),
        gated_launch_port=30100,
    )
    assert out == ARGV


def test_an_ipv6_leader_is_matched_by_value_and_written_in_brackets():
    spec = GroupSpec(GroupMode.ENV, 2, 0, "fd00::1", 20000, 0)
    assert fill(spec)[-2:] == ("--dist-init-addr", "[fd00::1]:20000")
    assert fill(spec, dist_init_addrs=("[fd00:0::1]:20000",)) == (
        *ARGV,
        "--nnodes",
        "2",
        "--node-rank",
        "0",
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"nnodes": 3},
            "LWS_GROUP_SIZE=2 but --nnodes 3 in the server arguments: they must agree (or leave "
            "--nnodes out and the supervisor fills it)",
        ),
        ({"nnodes": 1}, "LWS_GROUP_SIZE=2 but --nnodes 1"),
        ({"node_rank": 0}, "LWS_WORKER_INDEX=1 but --node-rank 0 in the server arguments"),
        (
            {"dist_init_addrs": ("sglang-0.sglang:20000", "10.0.0.1:20000")},
            "--dist-init-addr is given twice in the server arguments with different values "
            "(sglang-0.sglang:20000 and 10.0.0.1:20000)",
        ),
        (
            {"dist_init_addrs": ("sglang-0.sglang:20000", "sglang-0.sglang:20001")},
            "with different values",
        ),
        (
            {"dist_init_addrs": ("10.0.0.1:20000",)},
            "--dist-init-addr 10.0.0.1:20000 in the server arguments names host 10.0.0.1 but "
            "LWS_LEADER_ADDRESS=sglang-0.sglang",
        ),
        (
            {"dist_init_addrs": ("sglang-0.sglang:5000",)},
            "--dist-init-addr sglang-0.sglang:5000 in the server arguments has port 5000 but "
            "[group] dist_init_port = 20000",
        ),
        (
            {"gated_launch_port": 30200},
            "--gated-launch-port 30200 in the server arguments but [group] gate_port = 30100",
        ),
    ],
)
def test_a_flag_that_contradicts_the_group_is_refused_naming_both_values(given, message):
    assert message in refusal(**given)


def test_a_gate_flag_with_no_gate_port_is_refused_as_nobody_would_open_it():
    no_gate = GroupSpec(GroupMode.LWS, 2, 0, "sglang-0.sglang", 20000, 0)
    message = refusal(no_gate, gated_launch_port=30100)
    assert "[group] gate_port = 0 (no gate): nobody would open it" in message


def test_a_gate_flag_an_old_sglang_lacks_is_left_for_sglang_to_reject():
    assert fill(gate=False, gated_launch_port=30999) == (
        *ARGV, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "sglang-0.sglang:20000",
    )  # fmt: skip


def test_skypilot_names_where_its_leader_came_from():
    spec = GroupSpec(GroupMode.SKYPILOT, 3, 2, "10.0.0.5", 20000, 0)
    message = refusal(spec, dist_init_addrs=("10.0.0.6:20000",))
    assert "but the first of SKYPILOT_NODE_IPS is 10.0.0.5" in message
    assert "SKYPILOT_NUM_NODES=3 but --nnodes 2" in refusal(spec, nnodes=2)


@pytest.mark.parametrize(
    "addr",
    ["leader", "leader:", ":20000", "leader:port", "leader:65536", "fd00::1:20000", "[fd00::1]",
     "[fd00::1:20000", "[leader]:20000", "leader :20000", "leader:２０"],
)  # fmt: skip
def test_a_dist_init_addr_that_is_not_host_port_is_refused(addr):
    message = refusal(dist_init_addrs=(addr,))
    assert f"--dist-init-addr {addr!r} is not HOST:PORT" in message
    assert "in the server arguments" in message


# -- addresses -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("leader:20000", ("leader", 20000)),
        ("10.0.0.1:0", ("10.0.0.1", 0)),
        ("[::1]:65535", ("::1", 65535)),
        ("[FD00:0::1]:1", ("fd00::1", 1)),
    ],
)
def test_host_port_is_read_as_sglang_reads_it(text, parsed):
    assert split_host_port(text) == parsed


@given(
    host=st.one_of(
        st.ip_addresses().map(str),
        st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}", fullmatch=True),
    ),
    port=st.integers(0, 65535),
)
def test_a_written_address_reads_back_as_itself(host, port):
    host = parse_host(host)
    assert split_host_port(format_host_port(host, port)) == (host, port)
