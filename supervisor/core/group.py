"""Group mode: which node of a multi-node SGLang group this is (from LeaderWorkerSet, RBG,
SkyPilot or the supervisor's own variables) and the server flags that make the nodes' ranks one
group. Pure: the environment comes in as a mapping, the argv's given flags as GivenFlags.

The group's launch decision (reports, verdict, token) lives in core/group_report.py; its names
are importable from here too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import NamedTuple

from supervisor.core.group_address import format_host_port, parse_host, same_host, split_host_port
from supervisor.core.group_report import (
    REPORT_VERSION,
    DecisionState,
    GroupDecision,
    NodeReport,
    ReportError,
    decide_group,
    encode_report,
    missing_nodes,
    parse_decision,
    parse_report,
    token_matches,
    token_problem,
)

__all__ = [
    "GROUP_MODES",
    "REPORT_VERSION",
    "TOKEN_ENV",
    "DecisionState",
    "GivenFlags",
    "GroupDecision",
    "GroupError",
    "GroupMode",
    "GroupSpec",
    "NodeReport",
    "ReportError",
    "decide_group",
    "detect_family",
    "detect_group",
    "encode_report",
    "fill_group_argv",
    "group_token",
    "missing_nodes",
    "parse_decision",
    "parse_report",
    "token_matches",
    "token_problem",
]

GROUP_MODES = ("auto", "off", "lws", "rbg", "skypilot", "env")  # [group] mode
TOKEN_ENV = "SGLANG_SUPERVISOR_GROUP_TOKEN"


class GroupMode(str, Enum):
    LWS = "lws"
    RBG = "rbg"
    SKYPILOT = "skypilot"
    ENV = "env"


class _Family(NamedTuple):
    label: str
    leader: str  # SkyPilot: the list of every node's address, the leader's first
    size: str
    rank: str


_FAMILIES: dict[GroupMode, _Family] = {
    GroupMode.LWS: _Family(
        "LeaderWorkerSet", "LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"
    ),
    GroupMode.RBG: _Family(
        "RoleBasedGroup", "RBG_LWP_LEADER_ADDRESS", "RBG_LWP_GROUP_SIZE", "RBG_LWP_WORKER_INDEX"
    ),
    GroupMode.SKYPILOT: _Family(
        "SkyPilot", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK"
    ),
    GroupMode.ENV: _Family(
        "supervisor",
        "SGLANG_SUPERVISOR_GROUP_LEADER",
        "SGLANG_SUPERVISOR_GROUP_SIZE",
        "SGLANG_SUPERVISOR_GROUP_RANK",
    ),
}


class GroupError(ValueError):
    """The group's variables or the server's group flags are wrong; the message names them."""


@dataclasses.dataclass(frozen=True, slots=True)
class GroupSpec:
    """This node's place in its group."""

    mode: GroupMode
    size: int  # nodes in the group (>= 2)
    node_rank: int  # 0 = leader
    leader_host: str  # DNS name or IP, no port
    dist_init_port: int
    gate_port: int  # 0: no gate

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0

    @property
    def dist_init_addr(self) -> str:
        """SGLang's --dist-init-addr for this group: LEADER:PORT ([IPv6]:PORT)."""
        return format_host_port(self.leader_host, self.dist_init_port)

    @property
    def size_variable(self) -> str:
        return _FAMILIES[self.mode].size

    @property
    def rank_variable(self) -> str:
        return _FAMILIES[self.mode].rank

    @property
    def leader_source(self) -> str:
        """Where the leader's address came from, for messages."""
        variable = _FAMILIES[self.mode].leader
        if self.mode is GroupMode.SKYPILOT:
            return f"the first of {variable} is {self.leader_host}"
        return f"{variable}={self.leader_host}"


@dataclasses.dataclass(frozen=True, slots=True)
class GivenFlags:
    """The group flags the server's argv already gives (read by the shell's launch reader)."""

    nnodes: int | None
    node_rank: int | None
    dist_init_addrs: tuple[str, ...]  # every value given, in order
    gated_launch_port: int | None


# -- detection -----------------------------------------------------------------------------------


def detect_family(env: Mapping[str, str], mode: str) -> GroupMode | None:
    """The family of variables `mode` points at: the named one, or (auto) the one whose
    variables are present; None for off, or auto with none present.

    Raises:
        GroupError: an unknown mode, or auto with variables of two families present.
    """
    if mode == "off":
        return None
    if mode != "auto":
        try:
            return GroupMode(mode)
        except ValueError:
            raise GroupError(
                f"[group] mode must be one of {'|'.join(GROUP_MODES)} (got {mode!r})"
            ) from None
    present = [m for m, fam in _FAMILIES.items() if any(v in env for v in fam[1:])]
    if len(present) > 1:
        found = "; ".join(
            f"{_FAMILIES[m].label}: {', '.join(v for v in _FAMILIES[m][1:] if v in env)}"
            for m in present
        )
        raise GroupError(
            f"variables of more than one group launcher are set ({found}): set [group] mode to "
            f"the one to follow ({'|'.join(m.value for m in present)}) or off"
        )
    return present[0] if present else None


def detect_group(
    env: Mapping[str, str], mode: str, *, dist_init_port: int, gate_port: int
) -> GroupSpec | None:
    """This node's group, or None: mode off, no group variables (auto), or a group of one node.

    Raises:
        GroupError: variables missing or ambiguous, a size or rank that is not an integer, a
            size below 1, a rank out of range, an empty or malformed leader address.
    """
    family = detect_family(env, mode)
    if family is None:
        return None
    fam = _FAMILIES[family]
    missing = [v for v in fam[1:] if v not in env]
    if missing:
        present = [v for v in fam[1:] if v in env]
        given = f" ({', '.join(present)} set)" if present else ""
        raise GroupError(
            f"{fam.label} group mode needs {', '.join(fam[1:])}: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set{given}"
        )
    size = _integer(fam.size, env[fam.size])
    if size < 1:
        raise GroupError(f"{fam.size}={size} must be at least 1")
    rank = _integer(fam.rank, env[fam.rank])
    if not 0 <= rank < size:
        raise GroupError(f"{fam.rank}={rank} is out of range for {fam.size}={size}")
    if size == 1:
        return None
    if family is GroupMode.SKYPILOT:
        leader = _skypilot_leader(env[fam.leader], size)
    else:
        leader = _host(fam.leader, env[fam.leader])
    return GroupSpec(family, size, rank, leader, dist_init_port, gate_port)


def group_token(configured: str, env: Mapping[str, str]) -> str:
    """The group token: [group] token, else the environment's SGLANG_SUPERVISOR_GROUP_TOKEN.

    Raises:
        GroupError: neither is set, or the one in force is unfit (never shown).
    """
    source, token = "[group] token", configured
    if not token:
        source, token = TOKEN_ENV, env.get(TOKEN_ENV, "")
    if not token:
        raise GroupError(
            f"group mode needs a token shared by every node: set {TOKEN_ENV} (or [group] token)"
        )
    problem = token_problem(token)
    if problem is not None:
        raise GroupError(f"{source} {problem}")
    return token


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _integer(variable: str, text: str) -> int:
    if not _INTEGER.fullmatch(text.strip()):
        raise GroupError(f"{variable}={text!r} is not an integer")
    return int(text.strip())


def _host(variable: str, text: str) -> str:
    """The leader's address from `variable`: a DNS name or an IP, no port."""
    if not text.strip():
        raise GroupError(f"{variable} is empty: the leader's address is needed")
    try:
        return parse_host(text)
    except ValueError as exc:
        raise GroupError(f"{variable}={text!r} is {exc}") from None


def _skypilot_leader(ips: str, size: int) -> str:
    # SkyPilot writes one address per line, the head node's first; spaces are taken too.
    nodes = ips.split()
    if not nodes:
        raise GroupError("SKYPILOT_NODE_IPS is empty: the leader's address is needed")
    if len(nodes) != size:
        raise GroupError(
            f"SKYPILOT_NODE_IPS lists {len(nodes)} address(es) but SKYPILOT_NUM_NODES={size}: "
            "they must agree"
        )
    return _host("SKYPILOT_NODE_IPS (its first entry)", nodes[0])


# -- the server's group flags --------------------------------------------------------------------


def fill_group_argv(
    argv: Sequence[str], spec: GroupSpec, *, given: GivenFlags, gate_supported: bool
) -> tuple[str, ...]:
    """`argv` with the group's --nnodes, --node-rank, --dist-init-addr and (with a gate)
    --gated-launch-port appended; a flag already given with the group's value is kept as is.

    The gate flag goes to every node: each rank takes part in the gate's broadcast, and a rank
    without the flag skips it, so the collectives would not match
    (sglang/srt/distributed/gated_launch.py).

    Raises:
        GroupError: a given flag contradicts the group (both values named), --dist-init-addr
            given twice with different values or not HOST:PORT.
    """
    out = list(argv)
    keep_in_argv = "they must agree (or leave {flag} out and the supervisor fills it)"
    if given.nnodes is None:
        out += ["--nnodes", str(spec.size)]
    elif given.nnodes != spec.size:
        raise GroupError(
            f"{spec.size_variable}={spec.size} but --nnodes {given.nnodes} in the server "
            f"arguments: {keep_in_argv.format(flag='--nnodes')}"
        )
    if given.node_rank is None:
        out += ["--node-rank", str(spec.node_rank)]
    elif given.node_rank != spec.node_rank:
        raise GroupError(
            f"{spec.rank_variable}={spec.node_rank} but --node-rank {given.node_rank} in the "
            f"server arguments: {keep_in_argv.format(flag='--node-rank')}"
        )
    if not given.dist_init_addrs:
        out += ["--dist-init-addr", spec.dist_init_addr]
    else:
        _check_dist_init(given.dist_init_addrs, spec)
    gate_port = spec.gate_port if gate_supported else 0
    if given.gated_launch_port is None:
        if gate_port:
            out += ["--gated-launch-port", str(gate_port)]
    else:
        _check_gate(given.gated_launch_port, spec, gate_supported)
    return tuple(out)


def _check_dist_init(addrs: tuple[str, ...], spec: GroupSpec) -> None:
    try:
        parsed = [split_host_port(addr) for addr in addrs]
    except ValueError as exc:
        raise GroupError(f"--dist-init-addr {exc} in the server arguments") from None
    for addr, (host, port) in zip(addrs[1:], parsed[1:], strict=True):
        if not same_host(host, parsed[0][0]) or port != parsed[0][1]:
            raise GroupError(
                f"--dist-init-addr is given twice in the server arguments with different values "
                f"({addrs[0]} and {addr}): give it once (or leave it out and the supervisor "
                "fills it)"
            )
    host, port = parsed[0]
    if not same_host(host, spec.leader_host):
        raise GroupError(
            f"--dist-init-addr {addrs[0]} in the server arguments names host {host} but "
            f"{spec.leader_source}: they must agree (or leave --dist-init-addr out and the "
            "supervisor fills it)"
        )
    if port != spec.dist_init_port:
        raise GroupError(
            f"--dist-init-addr {addrs[0]} in the server arguments has port {port} but [group] "
            f"dist_init_port = {spec.dist_init_port}: they must agree (or leave "
            "--dist-init-addr out and the supervisor fills it)"
        )


def _check_gate(port: int, spec: GroupSpec, gate_supported: bool) -> None:
    if spec.gate_port == 0:
        # SGLang would wait at the gate for ever: the supervisor opens only gate_port.
        raise GroupError(
            f"--gated-launch-port {port} in the server arguments but [group] gate_port = 0 "
            f"(no gate): nobody would open it; set gate_port = {port} or leave the flag out"
        )
    if gate_supported and port != spec.gate_port:
        raise GroupError(
            f"--gated-launch-port {port} in the server arguments but [group] gate_port = "
            f"{spec.gate_port}: they must agree (or leave --gated-launch-port out and the "
            "supervisor fills it)"
        )
