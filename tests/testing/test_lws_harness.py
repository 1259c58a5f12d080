"""The LWS harness's own pieces (supervisor/testing/lws_harness.py): what each node is started
with (a config the product accepts, LeaderWorkerSet's variables, the group's ports) and how a
pod's processes are found. The group itself runs in tests/e2e/test_group.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.loader import load_config
from supervisor.testing.lws_config import DIST_INIT_RESERVED_PORTS, config_toml, group_ports
from supervisor.testing.lws_harness import TOKEN_ENV, Group
from supervisor.testing.lws_pod import POD_ENV, pod_pids
from tests.cgroups import instance_cgroups
from tests.e2e.group_support import lws_group
from tests.e2e.run_support import MODEL_CONFIG
from tests.testing.support import MARKER_ENV
from tests.waiting import wait_until


def _group(tmp_path: Path, **kwargs: object) -> Group:
    return Group(tmp_path, model_config=MODEL_CONFIG, **kwargs)  # type: ignore[arg-type]


def _config_of(group: Group, rank: int, generation: int, tmp_path: Path) -> Path:
    fill = {"state_dir": str(group.state_dir(rank)), "model_config": str(MODEL_CONFIG)}
    path = tmp_path / f"n{rank}g{generation}.toml"
    path.write_text(config_toml(group.node_sections(rank, generation), fill))
    return path


def test_each_node_gets_a_config_the_supervisor_accepts_with_the_groups_ports(tmp_path):
    def node_config(rank: int, generation: int) -> dict[str, dict[str, object]]:
        return {"host": {"mem_available": "2GB"}} if (rank, generation) == (1, 0) else {}

    group = _group(tmp_path, node_config=node_config)
    configs = {
        (rank, gen): load_config(_config_of(group, rank, gen, tmp_path))
        for rank in (0, 1)
        for gen in (0, 1)
    }
    for (rank, _gen), config in configs.items():
        assert config.run.name == group.instance_name(rank)
        assert config.run.state_dir == str(group.state_dir(rank))
        assert config.http.listen == f"127.0.0.1:{group.http_ports[rank]}"
        assert config.group.mode == "lws"
        assert config.group.leader_port == group.http_ports[0]
        assert config.group.dist_init_port == group.dist_init_port
        assert config.group.gate_port == group.gate_port
        assert config.gpu.backend == "sim"
    assert configs[1, 0].host.mem_available_bytes == 2 * 10**9
    assert configs[1, 1].host.mem_available_bytes == 1000 * 10**9  # only generation 0
    assert configs[0, 0].host.mem_available_bytes == 1000 * 10**9
    assert group.instance_name(0) != group.instance_name(1)


def test_each_node_gets_leaderworkersets_variables_and_nothing_of_other_launchers(tmp_path):
    inherited = {
        MARKER_ENV: "marker",
        "RBG_LWP_GROUP_SIZE": "4",
        "SKYPILOT_NODE_RANK": "3",
        "LWS_NAME": "stale",
        "NOTIFY_SOCKET": "@x",
    }
    group = _group(tmp_path, size=3, env=inherited, scenario=lambda r, g: {"startup_s": r + g})
    env = group.node_env(2, 1)
    assert env["LWS_LEADER_ADDRESS"] == "127.0.0.1"
    assert env["LWS_GROUP_SIZE"] == "3"
    assert env["LWS_WORKER_INDEX"] == "2"
    assert env[TOKEN_ENV] == group.token
    assert env[MARKER_ENV] == "marker"  # the suite's leak guard still finds every process
    assert env["FAKE_SGLANG_SCENARIO"] == '{"startup_s": 3}'
    assert env["FAKE_GPU_STATE_DIR"] == str(group.gpu_dir(2))
    assert env[POD_ENV] == f"{group.name}/g1/n2"
    for name in ("RBG_LWP_GROUP_SIZE", "SKYPILOT_NODE_RANK", "LWS_NAME", "NOTIFY_SOCKET"):
        assert name not in env


def test_the_groups_ports_are_distinct_and_clear_of_sglangs_dist_init_range():
    for size in (2, 4):
        sglang, http, dist_init, gate = group_ports(size)
        ports = [*sglang, *http, dist_init, gate]
        assert len(set(ports)) == len(ports) == 2 * size + 2
        for port in [*sglang, *http, gate]:
            assert not 0 <= port - dist_init <= DIST_INIT_RESERVED_PORTS


def test_a_pods_processes_are_found_by_its_marker_and_by_the_groups(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={POD_ENV: "lws-t/g0/n1"},
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: proc.pid in pod_pids("lws-t/g0/n1"), timeout_s=10, what="found")
        assert proc.pid in pod_pids("lws-t")
        assert proc.pid not in pod_pids("lws-t/g0/n0")
        assert proc.pid not in pod_pids("lws-t/g0/n10")
        assert proc.pid not in pod_pids("lws")
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.pid not in pod_pids("lws-t")


class _Failed(Exception):
    def __init__(self, group: Group) -> None:
        super().__init__("the test failed")
        self.group = group


def _fail_once_ready(tmp_path: Path) -> None:
    with lws_group(tmp_path, mode="recreate") as group:
        for node in group.nodes:
            node.wait_event("ready")
        raise _Failed(group)


@pytest.mark.slow
def test_a_test_failing_inside_the_group_leaves_no_process_and_no_recreation(tmp_path):
    with pytest.raises(_Failed) as failed:
        _fail_once_ready(tmp_path)
    group = failed.value.group
    assert group.alive_pids() == []
    assert all(code is not None for gen in group.exit_codes() for code in gen)
    assert group.generation == 0  # the supervisors killed at close were not recreated
    assert not any(instance_cgroups(group.instance_name(r)) for r in range(group.size))
