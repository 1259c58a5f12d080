"""The simulated SGLang across nodes: the rendezvous, the communicator and the gated launch
(supervisor/testing/rendezvous.py, gate.py), two simulated nodes on loopback.

Each test waits on what the servers show (log lines, HTTP answers, exit codes), never on time.
"""

from __future__ import annotations

import http.client
import re
import signal
import socket
from collections.abc import Callable

import psutil
import pytest

from supervisor.testing.args import SimArgsError, parse_sim_args
from supervisor.testing.rendezvous import parse_addr
from supervisor.testing.scenario import ScenarioError, parse_scenario
from tests.testing.support import FakeServer
from tests.waiting import wait_until

# Quick loads; a broken communicator hangs after 0.5 s; /health gives up on a rank after 0.5 s.
SCENARIO = {
    "startup_s": 0.1,
    "warmup_s": 0.1,
    "weight_shards": 0,
    "nccl_timeout_s": 0.5,
    "health_check_timeout_s": 0.5,
}
LAUNCH_SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
WAITING = "Gated launch waiting for activation. rank="
ACTIVATED = "Gated launch activated. elapsed="

Start = Callable[..., FakeServer]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _group(
    start: Start, *extra: str, scenario: dict[str, object] | None = None, first: int = 0
) -> tuple[FakeServer, FakeServer]:
    """Node 0 and node 1 of a TP 4 group (two ranks each); `first` is started first."""
    addr = f"127.0.0.1:{_port()}"
    servers: dict[int, FakeServer] = {}
    for node in (first, 1 - first):
        args = ["--tp", "4", "--nnodes", "2", "--node-rank", str(node), "--dist-init-addr", addr]
        servers[node] = start([*args, *extra], scenario=scenario or SCENARIO)
    return servers[0], servers[1]


def _up(*servers: FakeServer) -> None:
    for server in servers:
        _up_one(server)


def _up_one(server: FakeServer) -> None:
    wait_until(lambda: server.status() == 200, what=f"/health 200 on port {server.port}")


def _gate(port: int, method: str, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _lines_of(server: FakeServer, prefix: str) -> list[str]:
    """The log lines of one rank, by its logger prefix (" TP2")."""
    return [line for line in server.log_text().splitlines() if f"{prefix}] " in line]


def test_two_nodes_rendezvous_and_come_up_whichever_starts_first(start_fake_server):
    node0, node1 = _group(start_fake_server, first=1)  # node 1's ranks retry until rank 0 listens
    _up(node0, node1)
    assert set(node0.titled()) == {
        "sglang::scheduler_TP0",
        "sglang::scheduler_TP1",
        "sglang::detokenizer",
    }
    assert set(node1.titled()) == {"sglang::scheduler_TP2", "sglang::scheduler_TP3"}
    assert node0.status("/ready") == 200
    assert node1.status("/ready") == 404  # the dummy health server
    assert "Gated launch" not in node0.log_text() + node1.log_text()  # no gate without its flag


@pytest.mark.parametrize(
    ("node", "error"),
    [
        # The master counts itself; its other local rank may or may not have joined by then.
        (
            0,
            r"torch\.distributed\.DistStoreError: Timed out after \d+ seconds waiting for "
            r"clients\. [12]/4 clients joined\.",
        ),
        (
            1,
            r"torch\.distributed\.DistNetworkError: The client socket has timed out after 500ms "
            r"while trying to connect to \(127\.0\.0\.1, PORT\)\.",
        ),
    ],
)
def test_a_node_whose_peer_never_comes_fails_like_torch(start_fake_server, node, error):
    port = _port()
    addr = f"127.0.0.1:{port}"
    server = start_fake_server(
        ["--tp", "4", "--nnodes", "2", "--node-rank", str(node), "--dist-init-addr", addr],
        scenario={**SCENARIO, "dist_timeout_s": 0.5},
    )
    # The scheduler's exception: logged, SIGQUIT to the launcher, which kills the tree and itself.
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    log = server.log_text()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    pattern = re.compile(error.replace("PORT", str(port)))
    assert any(pattern.fullmatch(line) for line in log.splitlines()), log
    assert LAUNCH_SIGQUIT in log
    assert "Load weight begin." not in log


def test_a_taken_dist_init_port_fails_world_rank_0_like_torch(start_fake_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{port}"]
        server = start_fake_server(args, {**SCENARIO, "dist_timeout_s": 0.5})
        assert server.proc.wait(timeout=30) == -signal.SIGKILL
    assert (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        f"network address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: "
        "address already in use" in server.log_text().splitlines()
    )


def test_a_bad_dist_init_addr_fails_in_the_scheduler(start_fake_server):
    args = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", "127.0.0.1"]
    server = start_fake_server(args, SCENARIO)
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    assert (
        "ValueError: Missing port in address (expected host:port): '127.0.0.1'"
        in server.log_text().splitlines()
    )


def test_a_dead_worker_rank_hangs_node_0_while_the_worker_node_says_200(start_fake_server):
    node0, node1 = _group(start_fake_server)
    _up(node0, node1)
    ranks0 = list(node0.titled("sglang::scheduler").values())
    node1.titled()["sglang::scheduler_TP3"].kill()
    # Node 0's ranks wait on the dead peer: the health check times out on them.
    wait_until(lambda: node0.status() == 503, timeout_s=30, what="node 0's /health 503")
    assert node0.log_lines("Health check failed.")
    assert node1.status() == 200  # SGLang's dummy health server knows nothing of its ranks
    # Hung, not gone: no rank of node 0 exits by itself, the launcher stays up.
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks0)
    assert node0.proc.poll() is None
    assert node0.status() == 503


def test_a_clean_stop_of_node_0_stops_the_worker_node_through_the_shutdown_broadcast(
    start_fake_server,
):
    node0, node1 = _group(start_fake_server)
    _up(node0, node1)
    node1.proc.send_signal(signal.SIGTERM)  # a worker node only logs it and waits for rank 0
    wait_until(
        lambda: node1.log_lines("SIGTERM received on node_rank 1"), what="node 1's SIGTERM line"
    )
    assert node1.proc.poll() is None
    node0.proc.send_signal(signal.SIGTERM)
    assert node0.proc.wait(timeout=30) == 0
    assert node1.proc.wait(timeout=30) == 0
    assert len(node1.log_lines("terminated with 0")) == 2  # both ranks left on the ShutdownReq
    assert not node0.log_lines("Schedulers still alive")


def test_the_gate_holds_every_rank_of_both_nodes_until_activated(start_fake_server):
    gate = _port()
    node0, node1 = _group(start_fake_server, "--gated-launch-port", str(gate))
    wait_until(
        lambda: len(node0.log_lines(WAITING)) == 2 and len(node1.log_lines(WAITING)) == 2,
        what="every rank waiting at the gate",
    )
    waiting = sorted(line.rsplit(WAITING, 1)[1] for line in node0.log_lines(WAITING))
    assert waiting == ["0", "1"]
    assert sorted(line.rsplit(WAITING, 1)[1] for line in node1.log_lines(WAITING)) == ["2", "3"]
    assert node0.log_lines(f"Gated launch control server started on 127.0.0.1:{gate}")
    assert not node1.log_lines("Gated launch control server")  # world rank 0 only
    assert _gate(gate, "GET", "/health") == (200, "OK")
    assert node0.status() is None  # nothing loaded, no HTTP yet
    assert not node0.log_lines("Load weight begin.")
    assert not node1.log_lines("Load weight begin.")

    assert _gate(gate, "POST", "/gate/activate") == (200, "OK")
    _up(node0, node1)
    for server, prefixes in ((node0, (" TP0", " TP1")), (node1, (" TP2", " TP3"))):
        for prefix in prefixes:
            lines = _lines_of(server, prefix)
            opened = next(i for i, line in enumerate(lines) if ACTIVATED in line)
            loaded = next(i for i, line in enumerate(lines) if "Load weight begin." in line)
            assert opened < loaded, f"{prefix} loaded before the gate opened"
    assert _gate(gate, "GET", "/health") == (200, "OK")  # SGLang never stops the gate's server


def test_a_single_node_gate_works_without_dist_init_addr(start_fake_server):
    gate = _port()
    server = start_fake_server(["--tp", "2", "--gated-launch-port", str(gate)], SCENARIO)
    wait_until(lambda: len(server.log_lines(WAITING)) == 2, what="both ranks at the gate")
    assert not server.log_lines("Load weight begin.")
    assert _gate(gate, "POST", "/gate/activate") == (200, "OK")
    _up(server)
    assert len(server.log_lines(ACTIVATED)) == 2


def test_the_multi_node_flags_are_read_as_sglang_reads_them():
    args = parse_sim_args(
        ["--model", "m", "--nccl-init-addr", "[::1]:20000", "--gated-launch-port", "30100"]
    )
    assert (args.dist_init_addr, args.gated_launch_port, args.dist_timeout) == (
        "[::1]:20000",
        30100,
        None,
    )
    assert parse_addr("[::1]:20000") == ("::1", 20000)
    assert parse_addr("leader.lws:20000") == ("leader.lws", 20000)
    with pytest.raises(SimArgsError, match="ambiguous"):
        parse_sim_args(["--model", "m", "--dist", "x"])  # --dist-init-addr or --dist-timeout
    for bad in ("::1:20000", "host", "[::1]", ":20000", "host:port", "host:70000"):
        with pytest.raises(ValueError):  # noqa: PT011 - NetworkAddress.parse's messages vary
            parse_addr(bad)


def test_the_multi_node_scenario_keys_default_to_sglang_like_waits():
    scenario = parse_scenario("")
    assert (scenario.dist_timeout_s, scenario.nccl_timeout_s) == (60.0, 1.0)
    assert parse_scenario('{"nccl_timeout_s": 0.2}').nccl_timeout_s == 0.2
    with pytest.raises(ScenarioError, match="nccl_timeout_s"):
        parse_scenario('{"nccl_timeout_s": "soon"}')
