"""The configuration of the LWS harness's nodes: TOML written from nested mappings, ports."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Mapping
from typing import Any

Sections = Mapping[str, Mapping[str, Any]]

# Tiny timings (health every 0.2 s, no restart backoff to speak of); {placeholders} are filled
# per node. The [http], [group], [gpu] backend and [run] name/state_dir keys are the harness's.
DEFAULT_CONFIG: dict[str, dict[str, Any]] = {
    "server": {"model_config": "{model_config}"},
    "host": {"mem_available": "1000GB"},
    "preflight": {
        "reserve": "0B",
        "ledger_dir": "{state_dir}/ledger",
        "per_rank_overhead": "1MiB",
        "main_overhead": "1MiB",
    },
    "run": {
        "health_interval": "0.2s",
        "health_timeout": "2s",
        "failure_threshold": 3,
        "stop_grace": "5s",
        "worker_stop_grace": "2s",
        "backoff_initial": "0.1s",
        "backoff_max": "0.4s",
        "startup_stall_timeout": "30s",
    },
    "watchdog": {"enabled": False},
    "gpu": {"release_timeout": "20s"},
    "group": {"report_timeout": "30s", "resolve_timeout": "10s"},
}


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago (all bound at once)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


# SGLang keeps the ports just above --dist-init-addr's for itself (PortArgs.init_new in
# sglang/srt/server_args.py, with DP attention: port_base = dist_init_port + 1, 6 ports), and
# [group] refuses a gate_port there.
DIST_INIT_RESERVED_PORTS = 7


def group_ports(size: int) -> tuple[list[int], list[int], int, int]:
    """SGLang --port per node, listener port per node, dist-init port, gate port: all distinct,
    none in the range SGLang derives from the dist-init port."""
    for _ in range(100):
        ports = free_ports(2 * size + 2)
        dist_init, others = ports[-2], ports[:-2] + ports[-1:]
        if all(not 0 <= port - dist_init <= DIST_INIT_RESERVED_PORTS for port in others):
            return ports[:size], ports[size : 2 * size], dist_init, ports[-1]
    raise RuntimeError("no free dist-init port with the ports above it clear")  # pragma: no cover


def _toml_value(value: Any, fill: Mapping[str, str]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k} = {_toml_value(v, fill)}" for k, v in value.items())
        return "{ " + inner + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, fill) for v in value) + "]"
    text = str(value)
    for key, filled in fill.items():
        text = text.replace("{" + key + "}", filled)
    return json.dumps(text)


def config_toml(sections: Sections, fill: Mapping[str, str]) -> str:
    """TOML of `sections` ({placeholders} in strings filled from `fill`, nested ones too; None
    drops a key). The e2e tests' configs are written by it as well."""
    lines: list[str] = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v, fill)}" for k, v in keys.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


def merge(*layers: Sections) -> dict[str, dict[str, Any]]:
    """Section by section, later layers replacing keys of earlier ones."""
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for name, keys in layer.items():
            out.setdefault(name, {}).update(keys)
    return out
