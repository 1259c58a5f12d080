"""A simulated 2-node SGLang group under the LWS harness (supervisor/testing/lws_harness.py), as
the multi-node end-to-end tests use it: tiny timings and sizes, the suite's containment, and
the group's cgroups checked and removed at the end."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from supervisor.testing.lws_config import DEFAULT_CONFIG, merge
from supervisor.testing.lws_harness import Group, Mode, PerNode
from tests.cgroups import remove_instance_cgroups
from tests.e2e.run_support import CONTAINMENT, MODEL_CONFIG

# TP 4 over 2 nodes: two ranks per node, each with a 4 GB host pool (64 KiB of real memory).
HICACHE_GB = 4
SERVER_ARGS = ("--tp", "4", "--enable-hierarchical-cache", "--hicache-size", str(HICACHE_GB))
# Fast loads; a broken communicator hangs the survivors after 0.5 s; node 0's /health gives up on
# a silent rank after 0.3 s, so the leader's supervisor sees the hang within a second or two.
SCENARIO: dict[str, Any] = {
    "startup_s": 0.1,
    "warmup_s": 0.1,
    "weight_shards": 0,
    "nccl_timeout_s": 0.5,
    "health_check_timeout_s": 0.3,
    "dist_timeout_s": 30,
}
CONFIG = merge(DEFAULT_CONFIG, {"run": {"cgroup": CONTAINMENT}})


def scenario_for(extra: PerNode | None = None) -> PerNode:
    """SCENARIO with `extra(node_rank, generation)`'s keys on top."""

    def scenario(node_rank: int, generation: int) -> Mapping[str, Any]:
        return {**SCENARIO, **(extra(node_rank, generation) if extra else {})}

    return scenario


@contextlib.contextmanager
def lws_group(
    tmp_path: Path,
    *,
    mode: Mode,
    scenario: PerNode | None = None,
    node_config: PerNode | None = None,
    **kwargs: Any,
) -> Iterator[Group]:
    """The group, started; at exit everything of it is killed, and its cgroups removed (a test
    whose supervisors all ended by themselves or on SIGTERM fails if they left any)."""
    group = Group(
        tmp_path / "lws",
        model_config=MODEL_CONFIG,
        mode=mode,
        server_args=kwargs.pop("server_args", SERVER_ARGS),
        config=CONFIG,
        node_config=node_config,
        scenario=scenario_for(scenario),
        termination_grace_s=kwargs.pop("termination_grace_s", 15.0),
        **kwargs,
    )
    passed = ended_cleanly = False
    try:
        with group:
            yield group
            passed = True
            codes = [c for gen in group.exit_codes() for c in gen]
            ended_cleanly = all(c is not None and c != -signal.SIGKILL for c in codes)
    finally:
        left = [
            p for r in range(group.size) for p in remove_instance_cgroups(group.instance_name(r))
        ]
    if left and passed and ended_cleanly:
        raise AssertionError(f"the supervisors left cgroups behind (removed now): {left}")


def output_lines(events: list[dict[str, Any]]) -> list[str]:
    """SGLang's output lines, in order, from a node's `server_output` events."""
    return [str(e.get("line", "")) for e in events if e.get("event") == "server_output"]


def first_index(lines: list[str], needle: str) -> int:
    """Index of the first line containing `needle` (a failure naming it when none does)."""
    for i, line in enumerate(lines):
        if needle in line:
            return i
    raise AssertionError(f"no line contains {needle!r}; lines: {lines[-20:]!r}")
