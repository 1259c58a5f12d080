"""A simulated 2-node SGLang group, one real supervisor per node, under the LWS harness: the gate
opens only when every node fits, a node that does not fit stops the whole group before anything
is allocated, any local failure ends its node with exit 8 (the group must be recreated), the
recreated group carries the smaller --hicache-size, /healthz tells the truth on a worker whose
SGLang dummy health says 200 over a dead rank (issue 14, "Done when"), and a worker whose
leader is gone ends by itself although its own ranks only hang."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from supervisor.testing import gpu_state
from supervisor.testing.lws_pod import NodeRun
from tests.cgroups import instance_cgroups
from tests.e2e.group_support import HICACHE_GB, first_index, lws_group, output_lines
from tests.e2e.run_support import marked_pids
from tests.testing.support import leaked
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

WORKER_RANK = "sglang::scheduler_TP3"  # node 1's second rank: its main process still waits on TP2
LEADER_RANK = "sglang::scheduler_TP1"  # node 0's second rank


def _kill_worker_rank(worker: NodeRun) -> int:
    """SIGKILL node 1's last rank (not its first: SGLang's node >= 1 main process joins its
    schedulers in order, so it keeps serving the dummy health while TP2 hangs)."""
    pid = worker.schedulers()[WORKER_RANK]
    os.kill(pid, signal.SIGKILL)
    return pid


def _is_dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


def test_both_nodes_fit_so_the_leader_opens_the_gate_and_both_become_ready(tmp_path):
    with lws_group(tmp_path, mode="recreate") as group:
        leader, worker = group.nodes
        decision = leader.wait_event("group_decision")
        assert decision["state"] == "launch"
        leader.wait_event("group_gate_opened")
        for node in (leader, worker):
            node.wait_event("ready")
            assert node.wait_status("/readyz", 200)["ready"] is True
            assert node.wait_status("/healthz", 200)["live"] is True
        # The supervisors filled the group's flags; every node passes the gate's port.
        for rank, node in enumerate((leader, worker)):
            assert node.flag_value("--nnodes") == "2"
            assert node.flag_value("--node-rank") == str(rank)
            assert node.flag_value("--dist-init-addr") == f"127.0.0.1:{group.dist_init_port}"
            assert node.flag_value("--gated-launch-port") == str(group.gate_port)
        # Decided before anything launched; on every rank the weights load only after the gate.
        names = [e["event"] for e in leader.events()]
        assert names.index("group_decision") < names.index("launching")
        for node in (leader, worker):
            lines = output_lines(node.events())
            waiting = first_index(lines, "Gated launch waiting for activation")
            assert waiting < first_index(lines, "Gated launch activated")
            assert first_index(lines, "Gated launch activated") < first_index(lines, "Load weight")
        assert group.stop() == [0, 0]
        assert group.generation == 0


def test_a_worker_without_the_host_memory_stops_the_whole_group_before_anything_loads(tmp_path):
    small = {"host": {"mem_available": "2GB"}}  # 2 ranks x 4 GB of HiCache do not fit
    with lws_group(
        tmp_path, mode="observe", node_config=lambda rank, _gen: small if rank == 1 else {}
    ) as group:
        assert group.wait_all_exited(timeout_s=90) == [1, 1]
        leader, worker = group.nodes
        for node in (leader, worker):
            assert not node.events("launching"), f"node {node.node_rank} launched SGLang"
            assert not output_lines(node.events())
        report = next(e for e in leader.events("group_report_received") if e["node_rank"] == 1)
        assert report["fits"] is False
        refused = leader.events("group_refused")
        assert len(refused) == 1
        reason = refused[0]["reason"]
        assert "node 1" in reason
        assert socket.gethostname() in reason
        assert report["summary"] in reason  # the worker's own arithmetic, its numbers
        fatal = leader.events("fatal")[-1]
        assert fatal["exit_code"] == 1
        assert "node 1" in fatal["reason"]
        assert leader.events("group_decision")[-1]["state"] == "refused"
        # The worker learns why from the leader too, or refuses on its own verdict.
        assert worker.events("fatal")[-1]["exit_code"] == 1
        assert group.alive_pids() == []


def test_observe_a_dead_worker_rank_ends_every_node_with_exit_8_and_leaves_nothing(
    tmp_path, shm_record, simulated_process_guard
):
    with lws_group(tmp_path, mode="observe") as group:
        leader, worker = group.nodes
        for node in (leader, worker):
            node.wait_event("ready")
        _kill_worker_rank(worker)
        assert worker.wait_exit() == 8
        # The leader's ranks hang on the broken communicator; its SGLang's /health stops
        # answering ready and the leader's supervisor ends by itself.
        assert leader.wait_exit(timeout_s=90) == 8
        assert group.wait_all_exited() == [8, 8]
        failed = leader.events("server_failed")[-1]
        assert failed["failure"] == "health_timeout"
        for node in (leader, worker):
            assert node.events("group_must_recreate")
            assert not node.events("restarting")
            assert len(node.events("launching")) == 1
            assert node.leftover_pids == (), f"node {node.node_rank} left processes behind"
            assert node.tree() == []
        assert group.alive_pids() == []
        assert marked_pids(simulated_process_guard) == []  # the suite's marker: nothing at all
        assert not any(instance_cgroups(group.instance_name(r)) for r in range(2))
        assert leaked(shm_record) == []


def test_observe_a_dead_leader_rank_ends_the_worker_too_although_its_ranks_only_hang(
    tmp_path, shm_record, simulated_process_guard
):
    with lws_group(tmp_path, mode="observe") as group:
        leader, worker = group.nodes
        for node in (leader, worker):
            node.wait_event("ready")
        os.kill(leader.schedulers()[LEADER_RANK], signal.SIGKILL)
        assert leader.wait_exit() == 8
        assert leader.events("server_failed")[-1]["failure"] == "rank_crash"
        # The worker's ranks hang, alive, and SGLang's worker health says 200: only the
        # leader's supervisor going away tells the worker.
        assert worker.wait_exit(timeout_s=90) == 8
        assert group.wait_all_exited() == [8, 8]
        lost = worker.events("group_leader_lost")
        assert len(lost) == 1
        assert lost[0]["url"] == f"http://127.0.0.1:{leader.http_port}/healthz"
        assert lost[0]["misses"] == 3  # [run] failure_threshold
        failed = worker.events("server_failed")[-1]
        assert failed["failure"] == "peer_lost"
        assert worker.events("group_must_recreate")[-1]["failure"] == "peer_lost"
        for node in (leader, worker):
            assert not node.events("restarting")
            assert node.leftover_pids == (), f"node {node.node_rank} left processes behind"
            assert node.tree() == []
        assert group.alive_pids() == []
        assert marked_pids(simulated_process_guard) == []
        assert not any(instance_cgroups(group.instance_name(r)) for r in range(2))
        assert leaked(shm_record) == []


def test_a_node_killed_by_its_watchdog_gets_the_group_recreated_with_the_smaller_cache(tmp_path):
    def levels(warn: str, terminate: str, kill: str) -> dict[str, dict[str, Any]]:
        percents = {f"{level}_percent": 0.0 for level in ("warn", "terminate", "kill")}
        watchdog = {"enabled": True, "warn": warn, "terminate": terminate, "kill": kill}
        return {"watchdog": {**watchdog, **percents}}

    quiet = levels("3MiB", "2MiB", "1MiB")  # far below anything this machine reaches
    with lws_group(
        tmp_path, mode="recreate", node_config=lambda rank, _gen: quiet if rank == 1 else {}
    ) as group:
        for node in group.nodes:
            node.wait_event("ready")
        # Serving, node 1's operator reloads host levels no machine meets: its watchdog kills
        # the tree at the next tick (the decision itself is the watchdog tests' subject).
        first_worker = group.reconfigure(1, levels("300TB", "200TB", "100TB"))
        first_worker.wait_event("watchdog_limits_reloaded")
        killed = first_worker.wait_event("server_killed")
        assert killed["cause"] == "memory_kill"
        assert len(killed["pids"]) >= 3  # main process and both ranks: the whole tree
        smaller = first_worker.wait_event("hicache_shrunk")["hicache_size_gb"]
        assert smaller < HICACHE_GB
        assert first_worker.wait_exit() == 8
        leader, worker = group.wait_generation(1)
        for node in (leader, worker):
            node.wait_event("ready")
            assert node.flag_value("--hicache-size") == str(smaller)
        assert worker.events("hicache_override_applied")[0]["hicache_size_gb"] == smaller
        applied = leader.wait_event("group_hicache_applied")
        assert (applied["hicache_size_gb"], applied["own_gb"]) == (smaller, HICACHE_GB)
        assert leader.wait_event("group_decision")["hicache_size_gb"] == smaller
        assert group.stop() == [0, 0]


def test_recreate_a_dead_worker_rank_gets_the_group_recreated_and_ready_again(tmp_path):
    with lws_group(tmp_path, mode="recreate") as group:
        leader, worker = group.nodes
        for node in (leader, worker):
            node.wait_event("ready")
        before = set(group.alive_pids())
        _kill_worker_rank(worker)
        assert worker.wait_exit() == 8
        again = group.wait_generation(1)
        for node in again:
            node.wait_event("ready")
            assert node.wait_status("/readyz", 200)["ready"] is True
            assert node.wait_status("/healthz", 200)["live"] is True
        assert not before & set(group.alive_pids())  # every process of the group is new
        assert group.exit_codes()[0][1] == 8
        assert group.stop() == [0, 0]


def test_a_workers_healthz_says_503_over_a_dead_rank_while_sglangs_dummy_health_says_200(
    tmp_path,
):
    # Node 1's GPU memory stays held after its ranks die, so its supervisor waits in the GPU
    # release until the test resets the GPUs: /healthz is read in that window.
    stuck = {"gpu_stuck": True}
    config = {"gpu": {"release_timeout": "120s"}}
    with lws_group(
        tmp_path,
        mode="observe",
        scenario=lambda rank, _gen: stuck if rank == 1 else {},
        node_config=lambda rank, _gen: config if rank == 1 else {},
    ) as group:
        leader, worker = group.nodes
        for node in (leader, worker):
            node.wait_event("ready")
        assert worker.wait_status("/healthz", 200)["live"] is True
        assert worker.sglang_status("/health") == 200
        # The supervisor is frozen while the rank dies: SGLang's own answer is read with the
        # rank dead and nothing yet done about it.
        worker.signal(signal.SIGSTOP)
        try:
            pid = _kill_worker_rank(worker)
            wait_until(lambda: _is_dead(pid), timeout_s=10, what=f"rank {pid} dead")
            assert worker.sglang_status("/health") == 200
        finally:
            worker.signal(signal.SIGCONT)
        body = worker.wait_status("/healthz", 503)
        assert body["live"] is False
        assert body["reason"]
        assert worker.wait_status("/readyz", 503)["ready"] is False
        worker.wait_event("gpu_release_waiting")
        assert worker.exit_code is None
        for index in range(group.gpus_per_node):
            gpu_state.clear_gpu(worker.gpu_dir, index)  # the operator's `fake_gpu reset`
        assert worker.wait_exit() == 8
        assert group.wait_all_exited(timeout_s=90) == [8, 8]
