"""Group mode at start: this node's group from the environment and `[group]`, the server flags
that join its ranks to the group's, the listener every node must serve, and the handshake's
parts (the leader's board, a worker's link to it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog

from supervisor.adapters import group_http
from supervisor.config import GroupConfig, SupervisorConfig
from supervisor.config.metrics_sections import HttpConfig
from supervisor.core.group import (
    GivenFlags,
    GroupError,
    GroupSpec,
    detect_family,
    detect_group,
    fill_group_argv,
    group_token,
)
from supervisor.core.sglang_cli import ArgvError, merge_yaml, option_spans
from supervisor.core.sglang_launch import LaunchReader
from supervisor.errors import ConfigError
from supervisor.group.board import REPORT_PATH, GroupBoard
from supervisor.group.client import LeaderLink
from supervisor.group.handshake import GroupHandshake, node_host

log = structlog.get_logger("supervisor.group")

DEFAULT_PORT = 9400  # the listener's port in group mode when [http] listen is empty
POD_IP_ENV = "POD_IP"  # the pod's IP from the Downward API (status.podIP)
_GROUP_DESTS = ("nnodes", "node_rank", "dist_init_addr", "gated_launch_port")


def join_group(
    config: SupervisorConfig,
    env: Mapping[str, str],
    args: Sequence[str],
    reader: LaunchReader,
) -> tuple[GroupSpec | None, tuple[str, ...]]:
    """This node's group (None: one box) and the server argv with the group's flags; `args`
    must read well on their own (reader.plan).

    Raises:
        ConfigError: the variables are missing, partial, ambiguous or out of range; a flag in
            the argv contradicts them or cannot be split over the group; no usable group
            token (each message names what).
    """
    section = config.group
    try:
        spec = detect_group(
            env, section.mode, dist_init_port=section.dist_init_port, gate_port=section.gate_port
        )
        if spec is None:
            return None, tuple(args)
        group_token(section.token, env)  # required in group mode: refused now, not at a POST
        filled = fill_group_argv(
            args,
            spec,
            given=given_flags(reader, args),
            gate_supported=reader.rules.gated_launch,
        )
    except GroupError as exc:
        raise ConfigError(str(exc)) from None
    try:
        reader.plan(filled)
    except ArgvError as exc:  # e.g. --tp 4 over a group of 3 nodes
        raise ConfigError(
            f"the server arguments do not fit a group of {spec.size} nodes "
            f"({spec.size_variable}={spec.size}): {exc}"
        ) from None
    return spec, filled


def group_contradiction(
    config: SupervisorConfig,
    env: Mapping[str, str],
    args: Sequence[str],
    reader: LaunchReader,
) -> str | None:
    """What a launcher's variables contradict in `args`, named by both sources, or None (no
    group, or none found): asked when `args` do not read well on their own, whose reason
    (`--tp 2` does not divide over `--nnodes 3`) would hide the first cause (LWS_GROUP_SIZE=2
    but --nnodes 3)."""
    section = config.group
    try:
        spec = detect_group(
            env, section.mode, dist_init_port=section.dist_init_port, gate_port=section.gate_port
        )
        if spec is None:
            return None
        given = given_flags(reader, args)
        fill_group_argv(args, spec, given=given, gate_supported=reader.rules.gated_launch)
    except GroupError as exc:
        return str(exc)
    except (ArgvError, ValueError):  # the argv itself does not read: its own error says why
        return None
    return None


def single_node(config: SupervisorConfig, env: Mapping[str, str]) -> bool:
    """A launcher's variables are there but say a group of one node (one box, as usual)."""
    try:
        return detect_family(env, config.group.mode) is not None
    except GroupError:
        return False


def given_flags(reader: LaunchReader, args: Sequence[str]) -> GivenFlags:
    """The group flags `args` already give, as SGLang reads them: abbreviations, aliases
    (--nccl-init-addr), `--name=value`, and the `--config` YAML's keys."""
    table = reader.rules.cli().table
    merged = tuple(args)
    if reader.yaml_config is not None:
        merged = merge_yaml(
            args, reader.yaml_config, table, all_spellings=reader.rules.yaml_any_spelling
        )
    given: dict[str, list[str]] = {}
    for span in option_spans(merged, table):
        if span.flag.dest in _GROUP_DESTS:
            if "=" in span.token:
                value = span.token.partition("=")[2]
            else:
                value = merged[span.values[0]] if span.values else ""
            given.setdefault(span.flag.dest, []).append(value)

    def last_int(dest: str) -> int | None:  # argparse keeps the last; it checked the type
        values = given.get(dest)
        return int(values[-1]) if values else None

    return GivenFlags(
        nnodes=last_int("nnodes"),
        node_rank=last_int("node_rank"),
        dist_init_addrs=tuple(given.get("dist_init_addr", ())),
        gated_launch_port=last_int("gated_launch_port"),
    )


def listen_address(
    http: HttpConfig, group: GroupSpec | None, env: Mapping[str, str]
) -> tuple[str, int] | None:
    """Where the supervisor's listener binds: `[http] listen`; in group mode, when it is empty,
    the pod's IP ($POD_IP) or every address, port 9400. None: no listener."""
    if http.address is not None or group is None:
        return http.address
    return env.get(POD_IP_ENV, "").strip() or "0.0.0.0", DEFAULT_PORT


def leader_url(
    spec: GroupSpec, config: SupervisorConfig, env: Mapping[str, str], path: str = REPORT_PATH
) -> str:
    """`path` on the leader's supervisor (POST /group/report by default): `[group] leader_port`,
    else this node's own port."""
    port = config.group.leader_port
    if not port:
        address = listen_address(config.http, spec, env)
        port = address[1] if address is not None else DEFAULT_PORT
    return group_http.url(spec.leader_host, port, path)


def leader_board(
    spec: GroupSpec | None, section: GroupConfig, env: Mapping[str, str]
) -> GroupBoard | None:
    """The leader's board (None on a worker or one box)."""
    if spec is None or not spec.is_leader:
        return None
    return GroupBoard(spec.size, group_token(section.token, env))


def node_handshake(
    spec: GroupSpec | None,
    config: SupervisorConfig,
    env: Mapping[str, str],
    board: GroupBoard | None,
) -> GroupHandshake | None:
    """This node's part in the group's launch decision (None: one box)."""
    if spec is None:
        return None
    link = None
    if not spec.is_leader:
        token = group_token(config.group.token, env)
        link = LeaderLink(leader_url(spec, config, env), token, _post)
    return GroupHandshake(
        spec=spec,
        report_timeout_s=config.group.report_timeout_s,
        host=node_host(),
        board=board,
        link=link,
    )


def _post(url: str, payload: Mapping[str, object], token: str) -> group_http.Answer:
    return group_http.post_json(url, payload, token=token)


def group_secrets(config: SupervisorConfig, group: GroupSpec | None) -> tuple[str, ...]:
    """The group token, to be masked wherever secrets are (it may come from the config file)."""
    if group is None:
        return ()
    return (config.group.token,) if config.group.token else ()


def describe(spec: GroupSpec) -> dict[str, object]:
    """The `group_detected` event's fields (and `run --dry-run`'s group)."""
    return {
        "mode": spec.mode.value,
        "size": spec.size,
        "node_rank": spec.node_rank,
        "leader": spec.leader_host,
        "dist_init_addr": spec.dist_init_addr,
        "gate_port": spec.gate_port,
    }
