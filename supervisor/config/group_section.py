"""`[group]`: multi-node SGLang (LeaderWorkerSet, RBG, SkyPilot): how the group is found, its
ports, its token, how long to wait for the leader (docs/multi-node.md)."""

from __future__ import annotations

import dataclasses

from supervisor.config.limits import check_limits
from supervisor.errors import ConfigError

_DERIVED_PORTS = 6


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """Group mode: which launcher's variables say the group, its ports, token and timeouts."""

    # auto: the launcher whose variables are present (none: one box, as without [group]).
    mode: str = "auto"
    # --dist-init-addr LEADER:<this>; SGLang's LeaderWorkerSet example uses 20000.
    dist_init_port: int = 20000
    # SGLang's --gated-launch-port, served by world rank 0 on the leader; 0: no gate.
    gate_port: int = 30100
    leader_port: int = 0  # the leader's supervisor listener; 0: the same port as this node's
    # Shared by every node; empty: SGLANG_SUPERVISOR_GROUP_TOKEN. A secret: never shown.
    token: str = dataclasses.field(default="", repr=False)
    resolve_timeout_s: float = 600.0  # for the leader's address to resolve
    # Leader: for every node's report; worker: for the leader's decision.
    report_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        # The group's modules load only where [group] says something: every command reads the
        # config, and the pre-flight's cold start counts every import (BENCHMARKS.md).
        if self.mode != "auto":
            self._check_mode()
        self._check_ports()
        for key in ("resolve_timeout_s", "report_timeout_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"config key group.{key[:-2]} must be positive")
        if self.token:
            from supervisor.core.group_report import token_problem

            problem = token_problem(self.token)
            if problem is not None:  # the value stays out of the message: it is a secret
                raise ConfigError(f"config key group.token {problem}")
        check_limits(self, "group")

    def _check_mode(self) -> None:
        from supervisor.core.group import GROUP_MODES

        if self.mode not in GROUP_MODES:
            raise ConfigError(
                f"config key group.mode must be one of {'|'.join(GROUP_MODES)} (got {self.mode!r})"
            )

    def _check_ports(self) -> None:
        if not 1 <= self.dist_init_port <= 65535:
            raise ConfigError(
                f"config key group.dist_init_port must be a port, 1 to 65535 "
                f"(got {self.dist_init_port})"
            )
        for key in ("gate_port", "leader_port"):
            value = getattr(self, key)
            if not 0 <= value <= 65535:
                raise ConfigError(
                    f"config key group.{key} must be a port, 1 to 65535, or 0 (got {value})"
                )
        # With DP attention SGLang also listens on the ports just above dist_init_port
        # (PortArgs in sglang/srt/server_args.py: port_base = dist_init_port + 1, 6 ports).
        if 0 <= self.gate_port - self.dist_init_port <= _DERIVED_PORTS:
            raise ConfigError(
                f"config key group.gate_port ({self.gate_port}) must not be group.dist_init_port "
                f"({self.dist_init_port}) or one of the {_DERIVED_PORTS} ports above it: SGLang "
                "listens there on the leader"
            )
