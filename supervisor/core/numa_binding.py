"""Whether SGLang will bind each rank's memory to its GPU's NUMA node (utils/numa_utils.py).

Only a hard binding makes a NUMA node's free memory a limit of its own: with it, a node can run
out while the host still has memory. SGLang binds when `--numa-node` names the nodes, or, by
default, when the host has more than one node; with SGLANG_NUMA_BIND_V2 (the default) it does so
by running each scheduler under `numactl --membind`, so without numactl on PATH nothing is bound,
and where the kernel refuses the policy it relaxes to `--preferred`. With SGLANG_NUMA_BIND_V2=0
it sets a preferred node through libnuma, which lets memory spill to other nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from supervisor.core.sglang_facts import AUTO_NUMA_BIND_ENV, NUMA_BIND_V2_ENV


class Binding(str, Enum):
    MEMBIND = "membind"  # hard: a node's memory is the limit of its ranks' pools
    PREFERRED = "preferred"  # soft: pools prefer the node and spill to others
    NONE = "none"


def _flag(env: Mapping[str, str], name: str) -> bool:
    """SGLang's EnvBool: true unless set to a false spelling (both default to true)."""
    return env.get(name, "1").strip().lower() not in ("0", "false", "no", "off", "")


def sglang_binding(
    *, explicit: bool, nodes: int, numactl_on_path: bool, env: Mapping[str, str]
) -> tuple[Binding, str]:
    """(how SGLang will bind, why) for a host with `nodes` NUMA nodes."""
    if not explicit:
        if not _flag(env, AUTO_NUMA_BIND_ENV):
            return Binding.NONE, f"{AUTO_NUMA_BIND_ENV}=0 and no --numa-node"
        if nodes < 2:
            return Binding.NONE, "one NUMA node"
    if not _flag(env, NUMA_BIND_V2_ENV):
        return Binding.PREFERRED, f"{NUMA_BIND_V2_ENV}=0: a preferred node through libnuma"
    if not numactl_on_path:
        return Binding.NONE, "numactl is not on PATH"
    return Binding.MEMBIND, "numactl --membind (relaxed to --preferred where the kernel refuses)"
