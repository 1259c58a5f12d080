"""When SGLang binds a rank's memory to a NUMA node (utils/numa_utils.py), and how hard."""

from __future__ import annotations

import pytest

from supervisor.core.numa_binding import Binding, sglang_binding


@pytest.mark.parametrize(
    ("explicit", "nodes", "numactl", "env", "expected"),
    [
        (False, 2, True, {}, Binding.MEMBIND),
        (False, 1, True, {}, Binding.NONE),  # one node: nothing to bind to
        (True, 1, True, {}, Binding.MEMBIND),  # --numa-node binds even then
        (False, 2, False, {}, Binding.NONE),  # V2 runs numactl; without it, no binding
        (True, 2, False, {}, Binding.NONE),
        (False, 2, False, {"SGLANG_NUMA_BIND_V2": "0"}, Binding.PREFERRED),
        (False, 2, True, {"SGLANG_AUTO_NUMA_BIND": "false"}, Binding.NONE),
        (True, 2, True, {"SGLANG_AUTO_NUMA_BIND": "0"}, Binding.MEMBIND),
    ],
)
def test_binding_follows_sglang_s_conditions(explicit, nodes, numactl, env, expected):
    binding, _why = sglang_binding(explicit=explicit, nodes=nodes, numactl_on_path=numactl, env=env)
    assert binding is expected
